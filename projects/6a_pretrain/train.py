"""6A: pretrain GPT-2, one file top to bottom (nanoGPT's train.py layout; the reusable parts live in src/phase6).

    phase6 pretrain                                          # tiny GPT-2 on CPython's docs: CPU, offline, ~1 min
    phase6 pretrain experiment=smoke                         # the < 2 min CI / `make demo` run
    phase6 pretrain train.sanity=overfit_batch               # one fixed batch: the loss must go to ~0
    phase6 pretrain experiment=gpt2_124m_fineweb_edu train.dry_run_steps=20   # a config end to end, 20 steps
    torchrun --standalone --nproc_per_node 8 -m phase6 pretrain experiment=gpt2_124m_fineweb_edu
    torchrun ... -m phase6 pretrain experiment=... run.dir=<the run dir> train.resume=auto   # continue a killed run

A run, in order: devices -> data -> model -> PREDICT (printed and written to predicted.json before step 1) ->
parallelize (AC -> compile -> FSDP2 | DDP) -> optimizer -> resume -> loop: train step (grad accumulation with
gradient sync only on the last micro-step), val loss, atomic checkpoint -> HF export -> measured beside predicted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from phase6 import metrics
from phase6.checkpoint import latest_checkpoint, load_checkpoint, read_checkpoint_meta, save_checkpoint
from phase6.config import CONFIG_DIR
from phase6.config.pretrain import ModelConfig, PretrainRunConfig, check_precision, resume_changes
from phase6.cost import run_cost
from phase6.data.loader import ShardLoader, ValLoader, mark_verified
from phase6.data.prepare import ensure_prepared
from phase6.data.shards import Manifest, verify_shards
from phase6.dist import DistInfo, all_reduce_mean, barrier, init_distributed, teardown
from phase6.errors import UserError
from phase6.figures import save_figure
from phase6.models.gpt2 import GPT
from phase6.models.hf import export_hf, hf_tokenizer
from phase6.optim import build_optimizer, build_scheduler, clip_grad_norm
from phase6.parallel import parallelize, set_grad_sync
from phase6.plan.pretrain import LossReference, PretrainPrediction, predict_pretrain
from phase6.redact import redact
from phase6.runrecord import RunRecord, dumps
from phase6.timing import wall

OVERFIT_TARGET = 0.1  # train.sanity=overfit_batch passes when the final loss is below this


# ----------------------------------------------------------------------------------------------------------------
# predict first


def predict(
    cfg: PretrainRunConfig, model_cfg: ModelConfig, world: int, grad_accum_steps: int, gpt2_tokens: bool
) -> PretrainPrediction:
    """The planner's prediction for `model_cfg` on this run's hardware, batch geometry and token budget.

    The loss fits are in nats per GPT-2 token, so the loss is predicted only for GPT-2-tokenized data.
    """
    p = cfg.predict
    kwargs: dict[str, Any] = {}
    if not gpt2_tokens:
        kwargs["loss_reference"] = None
    elif p.loss_ref_params is not None:
        kwargs["loss_reference"] = LossReference(
            p.loss_ref_params, p.loss_ref_tokens, p.loss_ref_val_loss, p.loss_ref_source or "predict.loss_ref_*"
        )
    return predict_pretrain(
        model_cfg,
        cfg.hardware,
        seq_len=cfg.train.seq_len,
        micro_batch_size=cfg.train.micro_batch_size,
        grad_accum_steps=grad_accum_steps,
        num_gpus=world,
        parallel=cfg.parallel.mode,
        mfu=p.mfu,
        train_tokens=float(cfg.train.total_tokens()),
        activation_checkpointing=cfg.parallel.activation_checkpointing,
        optimizer=cfg.optim.algorithm,
        ns_steps=cfg.optim.muon_ns_steps,
        **kwargs,
    )


def scaling_rows(
    cfg: PretrainRunConfig, pred: PretrainPrediction, world: int, grad_accum_steps: int, gpt2_tokens: bool
) -> list[dict[str, Any]]:
    """This run's prediction and the same for predict.scaling_presets (larger models) at its budget and hardware."""
    preds = [(cfg.model.name, pred)]
    for name in cfg.predict.scaling_presets:
        mcfg = ModelConfig(**yaml.safe_load((CONFIG_DIR / "pretrain" / "model" / f"{name}.yaml").read_text()))
        preds.append((name, predict(cfg, mcfg, world, grad_accum_steps, gpt2_tokens)))
    rows = []
    for name, p in preds:
        pr = p.predicted()
        band = f"{pr['val_loss_low']:.3f}-{pr['val_loss_high']:.3f}" if "val_loss_low" in pr else None
        rows.append(
            {
                "model": name,
                "params": pr["params"],
                "GFLOP/token": pr["flops_per_token"] / 1e9,
                "tokens/s": pr[metrics.TOKENS_PER_S],
                "MFU %": pr[metrics.MFU_PCT],
                "GiB/GPU DDP": p.memory_gib["ddp"]["total"],
                "GiB/GPU FSDP2": p.memory_gib["fsdp2"]["total"],
                "val loss band": band,
                "GPU-hours": pr.get(metrics.COST_GPU_HOURS),
                "USD": pr.get(metrics.COST_USD),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------------------------
# helpers of the loop


@torch.no_grad()
def evaluate(pmodel: torch.nn.Module, val: ValLoader, autocast: AbstractContextManager, device: torch.device) -> float:
    """Mean next-token loss over the fixed val tokens, averaged over ranks (each rank scores its own windows)."""
    pmodel.eval()
    total = torch.zeros((), device=device)
    for x, y in val:
        with autocast:
            total += pmodel(x.to(device), y.to(device)).float()
    pmodel.train()
    return all_reduce_mean(total / len(val)).item()


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)  # host->device copy overlaps the previous kernels
    return t


def plot_curves(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """loss + val/loss against tokens, and the LR schedule, into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_step = {r["step"]: r for r in history}  # a resumed run may re-log steps: the last value wins
    steps = sorted(by_step)

    def series(key: str) -> tuple[list[int], list[float]]:
        have = [s for s in steps if by_step[s].get(key) is not None]
        return have, [by_step[s][key] for s in have]

    train, val, lr = series(metrics.LOSS), series(metrics.VAL_LOSS), series(metrics.LR)
    fig, (ax, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    ax.plot(*train, label="train loss", lw=1)
    ax.plot(*val, "o-", label="val loss", ms=3)
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    ax_lr.plot(*lr, color="tab:green")
    ax_lr.set_ylabel("lr")
    ax_lr.set_xlabel("optimizer step")
    ax_lr.grid(alpha=0.3)
    save_figure(fig, path, dpi=120)


def load_data(cfg: PretrainRunConfig, info: DistInfo) -> Manifest | None:
    """Prepare the shards if needed (one process only: a 10B-token prep must not run under a collective timeout),
    then verify them all before step 1 (`preflight_shards`)."""
    if cfg.auto_prepare and info.world_size == 1:
        ensure_prepared(cfg.data, show_progress=True)
    elif not Path(cfg.data.out_dir).is_dir():
        why = "multi-process runs never prepare data" if info.world_size > 1 else "auto_prepare=false"
        raise UserError(f"data.out_dir: {cfg.data.out_dir} does not exist ({why}); run `phase6 prepare-data` first")
    return preflight_shards(cfg.data.out_dir, info)  # None for llm.c / modded-nanogpt shards (no manifest)


def preflight_shards(data_dir: str, info: DistInfo) -> Manifest | None:
    """Every shard's header, the manifest's counts and every sha256, before step 1: a flipped byte in the last shard
    fails now, not hours in. The ranks share the hashing (shard i on rank i % world, threads within a rank) and
    exchange their findings, so every rank stops with the same one-line error."""
    t0 = wall()
    error = None
    try:
        manifest = verify_shards(data_dir, sha256=True, part=(info.rank, info.world_size))
    except ValueError as e:
        error, manifest = str(e), None
    errors = [error]
    if info.world_size > 1:
        errors = [None] * info.world_size
        torch.distributed.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise UserError(first)
    if manifest is not None:
        mark_verified([Path(data_dir) / s.file for s in manifest.shards])
        if info.is_main:
            gb = sum((Path(data_dir) / s.file).stat().st_size for s in manifest.shards) / 1e9
            print(
                f"data: {len(manifest.shards)} shards ({gb:.2f} GB) match manifest.json, sha256 checked in "
                f"{wall() - t0:.1f} s"
            )
    return manifest


# ----------------------------------------------------------------------------------------------------------------
# the run


def resume_config_changes(ckpt: Path, this_config: dict[str, Any]) -> dict[str, list[Any]]:
    """The keys this resumed run changes (applied, recorded), from the config the checkpoint was trained with (its
    ``meta.config``; an older checkpoint without it: the run's config.yaml); a key that cannot change is a
    UserError naming it."""
    saved = read_checkpoint_meta(ckpt)["meta"].get("config")
    if saved is None:
        original = ckpt.parent.parent / "config.yaml"
        if not original.is_file():
            return {}
        saved = {k: v for k, v in (yaml.safe_load(original.read_text()) or {}).items() if k != "job"}
    try:
        return resume_changes(saved, this_config, str(ckpt))
    except ValueError as e:
        raise UserError(str(e)) from None


def main(cfg: PretrainRunConfig) -> dict[str, Any]:
    info = init_distributed(cfg.device)
    try:
        return train(cfg, info)
    finally:
        teardown()


def train(cfg: PretrainRunConfig, info: DistInfo) -> dict[str, Any]:
    tc, device = cfg.train, info.device
    torch.manual_seed(cfg.run.seed)  # the same on every rank: identical initial weights (DDP also broadcasts them)
    use_bf16 = tc.dtype == "bf16" or (tc.dtype == "auto" and device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    check_precision(cfg.model, use_bf16)
    torch.backends.cuda.matmul.allow_tf32 = tc.tf32  # fp32 matmuls only; the kernel choices are in cfg.parallel

    # --- data: shards of data.out_dir; shard 0 = val; all verified before the run directory is written ---
    manifest = load_data(cfg, info)
    data_vocab = manifest.tokenizer.vocab_size if manifest is not None else 50257  # llm.c sets: GPT-2 ids
    if data_vocab > cfg.model.vocab_size:
        raise UserError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the data tokenizer's vocabulary "
            f"({data_vocab}, {cfg.data.out_dir}/manifest.json)"
        )
    gpt2_tokens = manifest is None or manifest.tokenizer.name == "gpt2"
    B, T = tc.micro_batch_size, tc.seq_len
    grad_accum_steps = tc.grad_accum_steps(info.world_size)
    train_loader = ShardLoader(cfg.data.out_dir, "train", B, T, info.rank, info.world_size)
    val_loader = None
    if tc.val_every and tc.sanity == "none":
        val_loader = ValLoader(cfg.data.out_dir, B, T, tc.val_tokens, info.rank, info.world_size)
    overfit_batch = train_loader.next_batch() if tc.sanity == "overfit_batch" else None
    tokenizer = None  # built now so a missing tokenizer file fails before training, not after it
    if tc.export_hf and manifest is not None and manifest.tokenizer.name != "byte":
        bpe_file = Path(cfg.data.out_dir) / manifest.tokenizer.file if manifest.tokenizer.file else None
        tokenizer = hf_tokenizer(manifest.tokenizer.name, cfg.data.tokenizer_dir, bpe_file)
    elif tc.export_hf and manifest is None:
        tokenizer = hf_tokenizer("gpt2", cfg.data.tokenizer_dir)
    # --- resume: the checkpoint's config against this one, before the run record is touched ---
    ckpt_dir = Path(cfg.run.dir) / "checkpoints"
    resume = latest_checkpoint(ckpt_dir) if tc.resume == "auto" else (Path(tc.resume) if tc.resume else None)
    this_config = redact(json.loads(dumps(dataclasses.asdict(cfg))))
    changes = resume_config_changes(resume, this_config) if resume is not None else {}
    rec = RunRecord(cfg, job="pretrain", rank=info.rank)

    # --- model: built on the target device with the run seed ---
    with torch.device(device):
        model = GPT(cfg.model)
    num_params = model.num_params()

    # --- predict first: printed and stored before step 1 ---
    pred: PretrainPrediction = predict(cfg, cfg.model, info.world_size, grad_accum_steps, gpt2_tokens)
    predicted = pred.predicted()
    # the run record masks string values under keys containing the word "token" (secrets): name the formula "flops"
    predicted["formulas"] = {("flops" if k == "flops_per_token" else k): v for k, v in predicted["formulas"].items()}
    scaling = scaling_rows(cfg, pred, info.world_size, grad_accum_steps, gpt2_tokens)
    if info.is_main:
        (rec.dir / "predicted.json").write_text(json.dumps(pred.as_dict(), indent=2, default=str))
        rec.print(
            f"predicted before step 1 ({cfg.model.name}, {num_params:,} params, {info.world_size} x "
            f"{cfg.hardware.name}, {tc.total_tokens():,} tokens):"
        )
        for k, v in predicted.items():
            if k != "formulas":
                rec.print(f"  {k:28s} {v:,.4g}" if isinstance(v, float) else f"  {k:28s} {v}")
        for k, v in predicted["formulas"].items():
            rec.print(f"  {k}: {v}")

    # --- parallelize in one fixed order, then the optimizer over the (possibly sharded) parameters ---
    compile_on = cfg.parallel.compile if cfg.parallel.compile is not None else device.type == "cuda"
    cfg.parallel = dataclasses.replace(cfg.parallel, compile=compile_on)  # resolved value in results.md
    pmodel = parallelize(model, cfg.parallel, info, param_dtype=torch.bfloat16 if use_bf16 else None)
    opt = build_optimizer(model, cfg.optim)
    sched = build_scheduler(opt, cfg.optim, tc.max_steps)

    # --- resume: model, optimizer, scheduler, loader position, RNG ---
    step = 0
    if resume is not None:
        base_lrs = list(sched.base_lrs)  # this config's peak LRs; the checkpoint's replace them on load
        state = load_checkpoint(resume, model, opt, sched)
        step = state["step"]
        train_loader.load_state_dict(state["data"])
        rec.print(f"resumed from {resume} at step {step}")
        if changes:
            if any(k.startswith("optim.") for k in changes):  # the new schedule from this step on
                sched.base_lrs = base_lrs
                for group, base, factor in zip(opt.param_groups, base_lrs, sched.lr_lambdas, strict=True):
                    group["initial_lr"], group["lr"] = base, base * factor(sched.last_epoch)
                sched._last_lr = [g["lr"] for g in opt.param_groups]  # what get_last_lr() reports for the next step
            rec.config_change(step, changes, source=str(resume))
            rec.print(
                f"resume changes at step {step}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items())
            )

    # --- the loop ---
    stop_at = min(tc.max_steps, tc.dry_run_steps) if tc.dry_run_steps else tc.max_steps
    history: list[dict[str, Any]] = []
    step_times: list[float] = []
    val_loss: float | None = None
    if val_loader is not None and step == 0:
        val_loss = evaluate(pmodel, val_loader, autocast, device)
        history.append({"step": 0, metrics.VAL_LOSS: val_loss})
        rec.log({metrics.VAL_LOSS: val_loss}, step=0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_loop = wall()
    first_step = step
    while step < stop_at:
        t0 = wall()
        loss_sum = torch.zeros((), device=device)
        for micro in range(grad_accum_steps):
            x, y = overfit_batch if overfit_batch is not None else train_loader.next_batch()
            x, y = to_device(x, device), to_device(y, device)  # (B, T) each
            set_grad_sync(pmodel, micro == grad_accum_steps - 1)  # all-reduce / reduce-scatter once per optimizer step
            with autocast:
                loss = pmodel(x, y)
            (loss / grad_accum_steps).backward()
            loss_sum += loss.detach()
        grad_norm = clip_grad_norm(model, cfg.optim.grad_clip)
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = all_reduce_mean(loss_sum / grad_accum_steps).item()  # the one host sync per step
        norm_val = grad_norm.item()
        dt = wall() - t0
        step += 1
        if not (math.isfinite(loss_val) and math.isfinite(norm_val)):
            last = latest_checkpoint(ckpt_dir)
            msg = (
                f"step {step}: loss {loss_val}, grad_norm {norm_val} is not finite; stopped "
                f"without saving. Last good checkpoint: {last or 'none'}"
            )
            rec.fail(msg)
            raise FloatingPointError(msg)
        step_times.append(dt)
        tps = tc.global_batch_tokens / dt
        row: dict[str, Any] = {
            metrics.LOSS: loss_val,
            metrics.LR: lr,
            metrics.GRAD_NORM: norm_val,
            metrics.STEP_TIME_S: dt,
            metrics.TOKENS_PER_S: tps,
            metrics.MFU_PCT: metrics.mfu_pct(tps, pred.flops_per_token, cfg.hardware.peak_bf16_tflops, info.world_size),
            metrics.TOKENS_SEEN: step * tc.global_batch_tokens,
        }
        if device.type == "cuda":
            row[metrics.MEM_MAX_ALLOCATED_GIB] = torch.cuda.max_memory_allocated(device) / 2**30
        if val_loader is not None and (step % tc.val_every == 0 or step == stop_at):
            val_loss = row[metrics.VAL_LOSS] = evaluate(pmodel, val_loader, autocast, device)
        rec.log(row, step=step)
        history.append({"step": step, **row})
        if (tc.ckpt_every and step % tc.ckpt_every == 0) or (step == tc.max_steps and tc.sanity == "none"):
            save_checkpoint(
                ckpt_dir,
                step,
                model,
                opt,
                sched,
                train_loader.state_dict(),
                meta={"model": dataclasses.asdict(cfg.model), "run": cfg.run.name, "config": this_config},
                keep=tc.keep_checkpoints,
            )
    loop_s = wall() - t_loop

    # --- HF export (full weights gathered from every rank; rank 0 writes) ---
    hf_dir = None
    if tc.export_hf and tc.sanity == "none":
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if info.is_main:
            cpu_model = GPT(cfg.model)
            cpu_model.load_state_dict(full)
            hf_dir = export_hf(cpu_model, rec.dir / "hf", tokenizer)
        barrier()

    # --- measured beside predicted ---
    steady = step_times[1:] if len(step_times) > 2 else step_times  # the first step includes compilation
    measured: dict[str, Any] = {}
    if steady:
        step_s = statistics.median(steady)
        tps = tc.global_batch_tokens / step_s
        hours = tc.total_tokens() / tps / 3600
        measured = {
            metrics.TOKENS_PER_S: tps,
            metrics.STEP_TIME_S: step_s,
            metrics.MFU_PCT: metrics.mfu_pct(tps, pred.flops_per_token, cfg.hardware.peak_bf16_tflops, info.world_size),
            metrics.MEM_MAX_ALLOCATED_GIB: (
                torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            ),
            metrics.VAL_LOSS: val_loss,
            "flops_per_token": pred.flops_per_token,
            "params": num_params,
            "train_hours": hours,
            metrics.COST_GPU_HOURS: hours * info.world_size,
            metrics.COST_USD: hours * info.world_size * cfg.hardware.usd_per_gpu_hour,
        }
    final_loss = history[-1].get(metrics.LOSS) if history else None
    trained_tokens = (step - first_step) * tc.global_batch_tokens
    cost = run_cost(cfg.hardware, info.world_size, loop_s, trained_tokens)
    summary = {
        "model": cfg.model.name,
        "params": num_params,
        "data": cfg.data.name,
        "gpus": info.world_size,
        "parallel": cfg.parallel.mode + (" + compile" if compile_on else ""),
        "steps": step,
        "tokens": step * tc.global_batch_tokens,
        "final_loss": final_loss,
        "val_loss": val_loss,
        "tokens_per_s": measured.get(metrics.TOKENS_PER_S),
        "mfu_pct": measured.get(metrics.MFU_PCT),
    }
    schedule = {
        "micro_batch_size B": B,
        "seq_len T": T,
        "world": info.world_size,
        "grad_accum_steps": grad_accum_steps,
        "tokens/step": tc.global_batch_tokens,
        "max_steps": tc.max_steps,
        "token budget": tc.total_tokens(),
        "schedule": cfg.optim.schedule,
        "optimizer": "Muon (hidden matrices) + AdamW" if cfg.optim.algorithm == "muon" else "AdamW",
        "peak lr": cfg.optim.lr,
        **({"peak lr Muon": cfg.optim.muon_lr} if cfg.optim.algorithm == "muon" else {}),
        "warmup": cfg.optim.num_warmup_steps(tc.max_steps),
        "warmdown": cfg.optim.num_warmdown_steps(tc.max_steps),
        "final lr": cfg.optim.lr * cfg.optim.min_lr_ratio,
        "precision": ("bf16 autocast, fp32 master" if use_bf16 else "fp32")
        + (f", {cfg.model.float8} fp8 block GEMMs" if cfg.model.float8 != "none" else "")
        + (" and lm_head" if cfg.model.float8_lm_head else "")
        + (", bf16 residual stream" if cfg.model.residual_dtype == "bf16" else ""),
    }
    notes = {
        "How to read this": (
            "predicted = written to predicted.json before step 1; measured tokens/s, step time and MFU are medians "
            "over this run's steps after the first (compilation); train_hours, GPU-hours and $ for the full token "
            f"budget ({tc.total_tokens():,} tokens) at that rate; the Cost table is the wall time actually spent "
            f"({loop_s:.1f} s of training loop for {trained_tokens:,} tokens, eval and checkpoints included)."
        ),
    }
    if not gpt2_tokens:
        notes["Loss prediction"] = (
            f"not made: the Chinchilla-style fits are in nats per GPT-2 token and this data is "
            f"tokenized with {manifest.tokenizer.name if manifest else '?'}"
        )
    if tc.sanity == "overfit_batch":
        ok = final_loss is not None and final_loss < OVERFIT_TARGET
        notes["Sanity: overfit one batch"] = (
            f"{'PASS' if ok else 'FAIL'}: final loss {final_loss:.4f} "
            f"{'<' if ok else '>='} {OVERFIT_TARGET} after {step} steps on one batch"
        )
    if tc.dry_run_steps:
        notes["Dry run"] = f"stopped after {step} of {tc.max_steps} steps (train.dry_run_steps)"
    if hf_dir is not None:
        notes["HF export"] = f"{hf_dir} (GPT2LMHeadModel safetensors; `phase6 eval model={hf_dir}`)"
    if info.is_main and history:
        plot_curves(history, rec.plots_dir / "loss_curve.png", f"{cfg.model.name} on {cfg.data.name}")
    rec.finish(
        [summary],
        predicted=predicted,
        measured=measured,
        cost=cost,
        tables={
            "Batch and LR schedule": [schedule],
            "Hyperparameters (value, justification, source)": cfg.hyperparameter_rows(),
            "Predicted memory per GPU (GiB)": [{"layout": k, **v} for k, v in pred.memory_gib.items()],
            "Predictions at this budget for larger presets": scaling,
        },
        notes=notes,
    )
    return {"run_dir": str(rec.dir), "summary": summary, "predicted": predicted, "measured": measured}
