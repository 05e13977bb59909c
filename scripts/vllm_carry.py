"""Pack a trimmed vLLM 0.26.0 or SGLang 0.5.16 (+ the closure the lent H200 image lacks) into pieces that fit one
device call each. ``--set`` names the wheel set (:data:`SETS`: its wheels, sdists, trim rules; default vllm).

    # here (CPU, internet through the package registry): the wheelhouse, then the pieces
    python scripts/vllm_carry.py download .dev/i19/whl        # pip download of WHEELS (cp312 manylinux, --no-deps)
    python scripts/vllm_carry.py pack .dev/i19/whl .dev/i19/pieces --piece-mib 56
    python scripts/vllm_carry.py --set sglang download .dev/i29/whl   # SGLang: SGLANG_WHEELS, trimmed by SGLANG_TRIM
    python scripts/vllm_carry.py --set sglang pack .dev/i29/whl .device/i29 --piece-mib 58   # one piece (~50 MiB)
    # on the device, one piece per call, calls back to back (a warm machine keeps /tmp):
    python3 scripts/vllm_carry.py unpack .dev/i19/pieces /tmp/vllm_carry --site /tmp/site   # each call; extracts
    export PYTHONPATH=/tmp/site                                                             #   once all are there

Why a trimmed tree and not `pip install`: the vLLM wheel is 304 MB (732 MB unpacked) and a device call carries 64 MiB
in all. Every wheel is unpacked here into one ``--target``-style tree (what ``pip install --no-deps --target`` writes:
the packages and their .dist-info, whose versions vLLM reads through importlib.metadata), the files vLLM does not
load for a dense decoder on Hopper are dropped (:data:`TRIM`), the tree is one tar.xz, and that is cut into byte
pieces of at most ``--piece-mib``. On the device each call appends its piece under /tmp; the call that completes the
set checks the sha256 of the whole archive and extracts it. Nothing is compiled; the image's python3 (3.12, torch
2.11.0+cu130, transformers 5.17) runs it. Sizes, measured: docs/benchmarks.md ("vLLM on the lent H200").

What is left out and why (docs/reference/vllm-on-h200 facts, then re-checked by the device run's import and serve):
the FA2 kernels (Hopper runs FA3: "FlashAttention version 3"), the fused-MoE kernels (dense models only), the
``vllm-rs`` binary (off by default), C++/CUDA headers under ``third_party/*/include``, deep_gemm builds for other
Python versions; whole packages never imported by a text decoder are simply not in the wheelhouse (tilelang,
PyNvVideoCodec, torchcodec, cudnn-frontend, cutlass-dsl, quack, humming, tokenspeed-mla, fastsafetensors,
mistral_common, compressed-tensors, depyf, anthropic, mcp, opentelemetry).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

WHEELS = [
    # vLLM (torch==2.11.0 pin = the image's torch) and what it imports at start that the image lacks
    "vllm==0.26.0",
    "flashinfer-python==0.6.14",
    "apache-tvm-ffi==0.1.10",  # vLLM's pin; xgrammar 0.2.9 needs >= 0.1.11 and fails to load with this one
    "xgrammar==0.2.7",
    "llguidance==1.7.6",
    "outlines_core==0.2.14",
    "pydantic==2.12.5",
    "pydantic-core==2.41.5",
    "annotated-types",
    "typing-inspection",
    "fastapi>=0.136,<0.137",
    "starlette>=1.0.1",
    "openai>=2,<3",  # 3.x needs another httpx
    "distro",
    "jiter",
    "sniffio",
    "openai-harmony",
    "msgspec",
    "pyzmq",
    "cbor2",
    "cachetools",
    "partial-json-parser",
    "pybase64",
    "blake3",
    "setproctitle",
    "ijson",
    "python-json-logger",
    "lark==1.2.2",
    "lm-format-enforcer==0.11.3",
    "interegular",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    # `vllm serve` (the OpenAI server) on top of offline LLM
    "uvicorn",
    "watchfiles",
    "httptools",
    "python-multipart",
    "model-hosting-container-standards",
    "jmespath",
    "supervisor",
    "prometheus-fastapi-instrumentator",
    # phase6's own CLI (Hydra) on the device
    "hydra-core==1.3.2",
    "omegaconf==2.3.0",
]
SDISTS = ["antlr4-python3-runtime==4.9.3"]
"""Pure-Python packages published only as sdists: built into a wheel here (``pip wheel``)."""

PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
]

TRIM = [
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # 305 MB; Hopper uses FA3 (optional import)
    "vllm/_moe_C_stable_libtorch.abi3.so",  # 48 MB; fused MoE only (optional import)
    "vllm/vllm-rs",  # 43 MB Rust front-end, off by default
    "vllm/third_party/*/include/*",  # CUTLASS/CuTe headers for run-time JIT of kernels a dense bf16 model skips
    "vllm/third_party/*/cutlass/*",
    "vllm/third_party/deep_gemm/_C.cpython-31[013456789]-*",  # builds for other Pythons (the image is 3.12)
    "*/__pycache__/*",
]


SGLANG_WHEELS = [
    # SGLang 0.5.16: the last release line pinning torch==2.11.0 (the image's); sglang-kernel and flashinfer at its
    # pins (shared/reference/sglang-on-h200.md)
    "sglang==0.5.16",
    "sglang-kernel==0.4.5",
    "flashinfer-python==0.6.14",
    "apache-tvm-ffi==0.1.11",
    "xgrammar==0.2.1",  # the default grammar backend, imported at start
    # llguidance left out: only --grammar-backend llguidance imports it (not on the server's import chain, measured)
    "interegular",
    "partial-json-parser",
    "openai==2.6.1",  # SGLang's pin (its OpenAI protocol types)
    "openai-harmony==0.0.4",  # imported by the OpenAI serving modules
    "distro",
    "jiter",
    "sniffio",
    "pydantic==2.12.5",
    "pydantic-core==2.41.5",
    "annotated-types",
    "typing-inspection",
    "fastapi>=0.136,<0.137",
    "starlette>=1.0.1",
    "uvicorn",
    "httptools",
    "watchfiles",
    "python-multipart",
    "orjson",
    "pybase64",
    "msgspec",
    "pyzmq",
    "setproctitle",
    "jsonschema",  # serving_chat (tool-call schemas)
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "zstandard",  # request decompression middleware
    "dill",  # sampling: custom logit processors
    "compressed-tensors",  # layers.quantization imports every quantization config at module level
    "loguru",
    "gguf",
    "soundfile==0.13.1",  # the OpenAI realtime/ASR routes, imported by the HTTP server (SGLang's pin)
    "cffi",
    "pycparser",
    "datasets==5.2.0",  # sglang.bench_serving imports every dataset loader (MMMU's needs HF datasets)
    "multiprocess",
    # sglang.utils imports IPython (notebook helpers) at module level
    "ipython",
    "ipython-pygments-lexers",
    "traitlets",
    "jedi",
    "parso",
    "decorator",
    "matplotlib-inline",
    "pexpect",
    "ptyprocess",
    "prompt-toolkit",
    "wcwidth",
    "stack-data",
    "asttokens",
    "executing",
    "pure-eval",
    # phase6's own CLI (Hydra) on the device
    "hydra-core==1.3.2",
    "omegaconf==2.3.0",
    # SGLang's transformers pin, first on PYTHONPATH over the image's 5.17 (which already registers "qwen3_asr", so
    # sglang.srt.configs' AutoConfig.register raised at import: call E, docs/benchmarks.md); transformers 5.12.1 wants
    # tokenizers <=0.23.0 (checked at import; the image has 0.23.2), huggingface-hub <2 and safetensors >=0.4.3 (the
    # image's 1.33 and 0.8 fit)
    "transformers==5.12.1",
    "tokenizers==0.22.2",
]

SGLANG_TRIM = [
    # sglang-kernel 0.4.5: 1.2 GB unpacked; the Hopper build of its ops is sm90/common_ops (18.6 MB)
    "sgl_kernel/flash_ops.abi3.so",  # 1.1 GB FA3 kernels: only the fa3 attention backend loads them (triton runs)
    "sgl_kernel/sm100/*",  # Blackwell build
    "sgl_kernel/infllm_ops*",  # InfLLM sparse attention
    "sgl_kernel/flashmla_ops*",  # MLA models only
    "xgrammar/lib/*.a",  # static library for C++ users (62 MB); the Python binding is its own .so
    "jedi/third_party/typeshed/*",  # IPython completion stubs (the server never completes code)
    # not imported by `sglang.launch_server` (TP=1, dense Qwen2, triton attention) nor sglang.bench_serving (measured:
    # the import chain's sys.modules and /proc/self/maps on CPU, docs/benchmarks.md)
    "zstandard/_cffi.*",  # the CFFI backend (12 MB); zstandard loads backend_c unless told otherwise
    "sglang/srt/grpc/_core.*",  # native gRPC server (7.6 MB), loaded only with --grpc-port
    "sglang/multimodal_gen/*",  # the diffusion server (`sglang serve` for image/video models)
    # flashinfer's JIT sources: keep include/, csrc/, spdlog/, cutlass/include + tools/util/include, cccl's headers
    # (flashinfer.jit.env and sglang.jit_kernel.utils.deps read those); drop the examples, tests, Python and docs
    "flashinfer/data/cutlass/examples/*",
    "flashinfer/data/cutlass/python/*",
    "flashinfer/data/cutlass/test/*",
    "flashinfer/data/cccl/python/*",
    "flashinfer/data/cccl/docs/*",
    "flashinfer/data/cccl/ci/*",
    "flashinfer/data/cccl/benchmarks/*",
    "*/__pycache__/*",
]


@dataclass(frozen=True)
class CarrySet:
    """One engine's wheelhouse: what ``download`` fetches, what ``pack`` drops, which wheel must be there."""

    wheels: list[str]
    sdists: list[str]
    trim: list[str]
    main: str


SETS = {
    "vllm": CarrySet(WHEELS, SDISTS, TRIM, "vllm"),
    "sglang": CarrySet(SGLANG_WHEELS, SDISTS, SGLANG_TRIM, "sglang"),
}


def trimmed(rel: str, trim: list[str] = TRIM) -> bool:
    return any(fnmatch.fnmatch(rel, pat) for pat in trim)


def download(wheelhouse: Path, carry_set: str = "vllm") -> None:
    cs = SETS[carry_set]
    wheelhouse.mkdir(parents=True, exist_ok=True)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    env = {**os.environ, "PIP_CONSTRAINT": ""}  # a machine-wide constraints file must not pin the device's closure
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    subprocess.run([*base, "--implementation", "cp", *plat, "-d", str(wheelhouse), *cs.wheels], check=True, env=env)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheelhouse), *cs.sdists], check=True, env=env
    )


def unpack_wheel(whl: Path, site: Path, trim: list[str] = TRIM) -> tuple[int, int]:
    """Unzip like ``pip install --no-deps --target`` (``*.data/purelib|platlib`` moved up); (kept, dropped) bytes."""
    kept = dropped = 0
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            rel = info.filename
            parts = rel.split("/")
            if parts[0].endswith(".data") and len(parts) > 2:
                if parts[1] not in ("purelib", "platlib"):
                    dropped += info.file_size  # scripts/headers/data: console scripts are not used under --target
                    continue
                rel = "/".join(parts[2:])
            if trimmed(rel, trim):
                dropped += info.file_size
                continue
            dest = site / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, dest.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            if info.external_attr >> 16 & 0o111:
                dest.chmod(0o755)
            kept += info.file_size
    return kept, dropped


def pack(wheelhouse: Path, out: Path, piece_mib: float, carry_set: str = "vllm") -> dict[str, object]:
    cs = SETS[carry_set]
    wheels = sorted(wheelhouse.glob("*.whl"))
    names = [w.name.split("-")[0].lower() for w in wheels]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"vllm_carry: {wheelhouse}: more than one wheel of {sorted(dup)} (keep one version each)")
    if not any(n == cs.main for n in names):
        raise SystemExit(f"vllm_carry: {wheelhouse}: no {cs.main} wheel (run the download step first)")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("site.tar.xz.*"):
        old.unlink()
    per_wheel = {}
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        for w in wheels:
            kept, dropped = unpack_wheel(w, site, cs.trim)
            per_wheel[w.name] = {"wheel_bytes": w.stat().st_size, "unpacked_bytes": kept, "trimmed_bytes": dropped}
        archive = Path(tmp) / "site.tar"
        with tarfile.open(archive, "w") as t:
            for p in sorted(site.rglob("*")):
                if p.is_file():
                    t.add(p, arcname=str(p.relative_to(site)))
        tar_bytes = archive.stat().st_size
        subprocess.run(["xz", "-6", "-T0", "-f", str(archive)], check=True)  # -9e: ~1 % smaller, many times slower
        xz = archive.with_suffix(".tar.xz")
        data = xz.read_bytes()
    limit = int(piece_mib * 2**20)
    pieces = []
    for i in range(0, len(data), limit):
        piece = out / f"site.tar.xz.{i // limit:02d}"
        piece.write_bytes(data[i : i + limit])
        pieces.append({"name": piece.name, "bytes": piece.stat().st_size})
    manifest = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "xz_bytes": len(data),
        "tar_bytes": tar_bytes,
        "pieces": pieces,
        "set": carry_set,
        "trim": cs.trim,
        "wheels": per_wheel,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpack(pieces_dir: Path, stage: Path, site: Path) -> int:
    """Copy the pieces present under ``pieces_dir`` to ``stage``; once all are staged and the sha256 matches,
    extract into ``site``. 0 = extracted (or already), 3 = still waiting for pieces (not an error)."""
    manifest = json.loads((pieces_dir / "manifest.json").read_text())
    stage.mkdir(parents=True, exist_ok=True)
    done = stage / "EXTRACTED"
    if done.exists() and done.read_text().strip() == manifest["sha256"]:
        print(f"vllm_carry: {site} already extracted ({manifest['sha256'][:12]})")
        return 0
    for p in manifest["pieces"]:
        src = pieces_dir / p["name"]
        if src.is_file() and src.stat().st_size == p["bytes"]:
            shutil.copyfile(src, stage / p["name"])
    missing = [p["name"] for p in manifest["pieces"] if not (stage / p["name"]).is_file()]
    if missing:
        print(f"vllm_carry: staged under {stage}; waiting for {missing}")
        return 3
    h = hashlib.sha256()
    whole = stage / "site.tar.xz"
    with whole.open("wb") as f:
        for p in manifest["pieces"]:
            b = (stage / p["name"]).read_bytes()
            h.update(b)
            f.write(b)
    if h.hexdigest() != manifest["sha256"]:
        raise SystemExit(f"vllm_carry: sha256 of the reassembled archive {h.hexdigest()} != {manifest['sha256']}")
    site.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xJf", str(whole), "-C", str(site)], check=True)
    done.write_text(manifest["sha256"] + "\n")
    print(f"vllm_carry: extracted {manifest['tar_bytes'] / 1e6:.1f} MB into {site}")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", dest="carry_set", choices=sorted(SETS), default="vllm", help="which wheel set (SETS)")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download")
    d.add_argument("wheelhouse", type=Path)
    k = sub.add_parser("pack")
    k.add_argument("wheelhouse", type=Path)
    k.add_argument("out", type=Path)
    k.add_argument("--piece-mib", type=float, default=56.0, help="largest piece (a call carries 64 MiB in all)")
    u = sub.add_parser("unpack")
    u.add_argument("pieces", type=Path)
    u.add_argument("stage", type=Path)
    u.add_argument("--site", type=Path, default=Path("/tmp/site"))
    a = p.parse_args(argv)
    if a.cmd == "download":
        download(a.wheelhouse, a.carry_set)
        return 0
    if a.cmd == "pack":
        m = pack(a.wheelhouse, a.out, a.piece_mib, a.carry_set)
        print(json.dumps({k: m[k] for k in ("sha256", "xz_bytes", "tar_bytes", "pieces")}, indent=1))
        return 0
    return unpack(a.pieces, a.stage, a.site)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
