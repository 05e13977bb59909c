"""The run directory every job writes, and the one logger that fans out to console, files and W&B.

    <run dir>/config.yaml     resolved config (secrets redacted)
    <run dir>/env.json        git sha + dirty flag, package versions, GPUs, host, command line
    <run dir>/metrics.jsonl   one JSON object per logged step
    <run dir>/results.json    {"job", "status", "rows", "predicted", "measured", "cost", ...}; written at the end,
                              "status": "complete" or "failed" (with "error"); a run killed before has none
    <run dir>/config_changes.jsonl  what each resume changed, at which step (config.yaml stays the original)
    <run dir>/.phase6.lock    the writer's lock (flock) while the run is live: pid, host, start time
    <run dir>/results.md      the same tables as markdown
    <run dir>/plots/*.png

Only rank 0 writes or logs. The last line a job prints is ``run dir: <path>``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from phase6.nvml import gpu_info
from phase6.redact import redact, redact_argv, redact_text
from phase6.terminal import format_rows
from phase6.timing import wall

PACKAGES = (
    "phase6",
    "torch",
    "transformers",
    "trl",
    "peft",
    "datasets",
    "accelerate",
    "tiktoken",
    "wandb",
    "hydra-core",
    "omegaconf",
    "lm-eval",
    "vllm",
    "sglang",
    "verl",
    "numpy",
    "triton",
    "simpy",
)
ENV_PREFIXES = (
    "CUDA",
    "NCCL",
    "TORCH",
    "HF_",
    "WANDB",
    "OMP_",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_",
    "TIKTOKEN",
    "PYTORCH",
)


def to_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)  # type: ignore[arg-type]
    return dict(cfg)


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)  # type: ignore[arg-type]
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every reader can parse the file."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(_clean(json.loads(json.dumps(obj, default=_json_default))), allow_nan=False)


def git_info(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        return {"sha": sha or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}


def env_info(overrides: list[str] | None = None) -> dict[str, Any]:
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return {
        "git": git_info(Path(__file__).resolve().parents[2]),
        "packages": versions,
        "python": sys.version.split()[0],
        "gpus": gpu_info(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "command": " ".join(redact_argv(sys.argv)),
        "overrides": redact_text(" ".join(overrides or [])),
        "env": redact({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_(no rows)_\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            if not math.isfinite(v):
                return str(v)
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
        if v is None:
            return "–"
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def predicted_vs_measured(predicted: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``quantity | predicted | measured | measured/predicted`` for the numeric keys both sides have."""
    rows = []
    for k in predicted:
        p, m = predicted.get(k), measured.get(k)
        if isinstance(p, (int, float)) and not isinstance(p, bool):
            ratio = (m / p) if isinstance(m, (int, float)) and p else None
            rows.append({"quantity": k, "predicted": p, "measured": m, "measured/predicted": ratio})
    return rows


def render_markdown(results: dict[str, Any], plots: list[str] | None = None) -> str:
    out = [f"# {results.get('job', 'run')} results\n"]
    if results.get("status") == "failed":  # the banner `RunRecord.fail` writes; `phase6 report` keeps it
        out.append(f"**FAILED**: {results.get('error') or 'no reason recorded'}\n")
    if results.get("title"):
        out.append(f"{results['title']}\n")
    out += ["## Results\n", markdown_table(results.get("rows", []))]
    pred, meas = results.get("predicted"), results.get("measured")
    if pred:
        out += ["\n## Predicted vs measured\n"]
        if pred.get("formulas"):
            out += [f"- {k}: {v}" for k, v in pred["formulas"].items()] + [""]
        out.append(markdown_table(predicted_vs_measured(pred, meas or {})))
    if results.get("cost"):
        c = results["cost"]
        out += ["\n## Cost\n", markdown_table([{k: v for k, v in c.items() if not isinstance(v, (dict, list))}])]
    for name, rows in (results.get("tables") or {}).items():
        out += [f"\n## {name}\n", markdown_table(rows)]
    for name, text in (results.get("notes") or {}).items():
        out += [f"\n## {name}\n", str(text).rstrip() + "\n"]
    if plots:
        out += ["\n## Plots\n"] + [f"![{Path(p).stem}]({p})\n" for p in plots]
    return "\n".join(out)


def wandb_mode(requested: str | None) -> str:
    """online only when asked (logger.mode / WANDB_MODE) or logged in; offline by default, never a surprise upload."""
    if requested:
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if "api.wandb.ai" in netrc.read_text():
            return "online"
    except OSError:
        pass
    return "offline"


RESERVED_BYTES = 4096
RESERVE_FILE = ".results.reserve"
"""RESERVED_BYTES written when a run starts, where ``RunRecord.fail`` can still write on a full disk."""
RECORD_FILES = ("config.yaml", "env.json", "metrics.jsonl", "results.json", "predicted.json", "checkpoints")
"""What a phase6 run leaves in its directory; any of these marks the directory as holding a run."""


def run_records(path: Path) -> list[str]:
    """The run records in ``path`` or its direct subdirectories (a sweep's members), as relative paths."""
    if not path.is_dir():
        return []
    found = []
    for d in (path, *sorted(c for c in path.iterdir() if c.is_dir())):
        for name in RECORD_FILES:
            f = d / name
            if f.is_file() or (f.is_dir() and any(f.iterdir())):
                found.append(str(f.relative_to(path)))
    return found


LOCK_FILE = ".phase6.lock"
"""Inside the run directory: flock'ed by the one process that writes it, for the run's life; holds its pid/host."""
_LOCKS: dict[str, int] = {}  # run dir -> the open, flock'ed descriptor of its lock file (this process's)


def _holder(fd: int) -> str:
    """The holder recorded in a lock file, as words ("pid 123 on host h, started 2026-...")."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict) or "pid" not in info:
        return ""
    return f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started')}"


def lock_run_dir(path: str | Path) -> None:
    """Take the exclusive writer lock of run dir ``path`` (created if absent) for this process's life.

    ``fcntl.flock`` on ``<path>/.phase6.lock``: the kernel drops it when the holder exits, however it exits, so a
    lock file left by a killed process is not held and is taken over (said on stderr). A lock held by a live
    process refuses this one in one line naming the holder. ``unlock_run_dir`` removes the file.
    """
    import fcntl

    from phase6.errors import UserError

    path = Path(path)
    if str(path) in _LOCKS:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = path / LOCK_FILE
        while True:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd) or "holder not yet recorded"
                os.close(fd)
                raise UserError(
                    f"run.dir: {path} is being written by another phase6 run ({holder}); wait for it to end, "
                    "or pick another run.dir"
                ) from None
            # the previous holder may have removed the file between our open and flock: lock the one on disk
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = _holder(fd)
        if stale:
            print(f"run.dir: {path}: took over the lock left by {stale}, which no longer holds it", file=sys.stderr)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except PermissionError as e:  # EACCES / EPERM: run.dir (or its parent) is not writable by this user
        raise UserError(f"run.dir: {e.filename or path}: not writable ({e.strerror})") from None
    except OSError as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"run.dir: {e.filename or path}: {e.strerror or e}") from None
    _LOCKS[str(path)] = fd


def unlock_run_dir(path: str | Path | None = None) -> None:
    """Release the lock of ``path`` (every lock this process holds when None) and remove its lock file."""
    for key in [str(path)] if path is not None else list(_LOCKS):
        fd = _LOCKS.pop(key, None)
        if fd is None:
            continue
        lock = Path(key) / LOCK_FILE
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                lock.unlink()  # before the unlock: a waiter that opened this file re-checks the inode and retries
        except OSError:
            pass
        os.close(fd)


atexit.register(unlock_run_dir)


def claim_run_dir(path: str | Path, *, overwrite: bool, resume: bool, resumable: bool = True) -> None:
    """Make ``path`` safe to write this run's records into, before anything is built.

    First the writer lock (``lock_run_dir``): a live writer refuses this run, resume and overwrite included.
    Then: empty or absent: fine. Holding another run's records: refused with one line, unless the run resumes them
    (``resume``) or ``overwrite`` asks to replace them, which moves the old directory aside, never deletes it; the
    refusal suggests ``train.resume=auto`` only to a job that has it (``resumable``).
    Only rank 0 decides and holds the lock (under torchrun the other ranks would see rank 0's fresh records).
    """
    from phase6.errors import UserError

    path = Path(path)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    lock_run_dir(path)
    if resume:
        return
    found = run_records(path)
    if not found:
        return
    if not overwrite:
        unlock_run_dir(path)
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        how = "resume it (train.resume=auto), " if resumable else ""
        raise UserError(
            f"run.dir: {path} holds another run's records ({shown}); {how}pick another run.dir, or set "
            "run.overwrite=true to move the old one aside"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.replaced-{stamp}-{n}")
        n += 1
    os.replace(path, aside)
    fd = _LOCKS.pop(str(path))  # our lock moved with the old directory: drop it there, take the new one's
    with contextlib.suppress(OSError):
        (aside / LOCK_FILE).unlink()
    os.close(fd)
    lock_run_dir(path)
    print(f"run.overwrite: moved the previous run in {path} to {aside}", file=sys.stderr, flush=True)


# Records opened in this process and not finished: marked failed if the job raises.
_OPEN: list[RunRecord] = []


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def mark_failed(error: BaseException) -> None:
    """Write ``status: failed`` and the one-line error into every unfinished run record of this process."""
    from phase6.errors import one_line

    while _OPEN:
        _OPEN.pop().fail(one_line(error))


class RunRecord:
    """A run directory plus the fan-out logger (console, metrics.jsonl, W&B); inert on ranks other than 0."""

    def __init__(self, cfg: Any, job: str, rank: int | None = None) -> None:
        self.cfg, self.job = cfg, job
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.is_main = self.rank == 0
        # decided once by the launcher (phase6.launch.run_job) and handed down; a caller outside it sets it itself
        assert cfg.run.dir, "cfg.run.dir is unset: the launcher (phase6.launch.run_job) decides the run directory"
        self.dir = Path(cfg.run.dir)
        self.plots_dir = self.dir / "plots"
        self.t0 = wall()
        self._wandb: Any = None
        self._metrics_f = None
        self._console = None
        self.changes: list[dict[str, Any]] = []
        if not self.is_main:
            return
        self.plots_dir.mkdir(parents=True, exist_ok=True)
        _OPEN.append(self)
        self.config_dict = redact(json.loads(dumps(to_dict(cfg))))
        resumed = bool(getattr(getattr(cfg, "train", None), "resume", None))
        if not (resumed and (self.dir / "config.yaml").is_file()):  # a resume keeps the original; changes: below
            (self.dir / "config.yaml").write_text(yaml.safe_dump({"job": job, **self.config_dict}, sort_keys=False))
        # Room for the failed status, taken while the disk has some: a run stopped by a full disk can still say so
        # (``fail`` writes into these bytes in place and renames the file to results.json; ``finish`` removes it).
        (self.dir / RESERVE_FILE).write_bytes(b" " * RESERVED_BYTES)
        (self.dir / "env.json").write_text(json.dumps(env_info(list(cfg.run.overrides)), indent=2))
        self._metrics_f = open(self.dir / "metrics.jsonl", "a", buffering=1)
        logger = getattr(cfg, "logger", None)
        if logger is not None and logger.console:
            from rich.console import Console

            self._console = Console(stderr=False)
        if logger is not None and logger.wandb:
            self._init_wandb(logger)

    def _init_wandb(self, logger: Any) -> None:
        mode = wandb_mode(logger.mode)
        if mode == "disabled":
            return
        import wandb

        # The process-wide settings must carry the mode too: with only init(mode="offline"), W&B's telemetry proxy
        # still POSTs to its server once (caught by tests/test_foundation_records.py through a loopback proxy).
        # W&B records the command line (settings._args = sys.argv[1:]): it sees the redacted one.
        argv = sys.argv
        sys.argv = redact_argv(argv)
        try:
            wandb.setup(settings=wandb.Settings(mode=mode))
            self._wandb = wandb.init(
                project=logger.project,
                entity=logger.entity,
                name=f"{self.job}/{self.dir.name}",
                dir=str(self.dir),
                mode=mode,
                config=self.config_dict,
                job_type=self.job,
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
            )
        finally:
            sys.argv = argv

    def config_change(self, step: int, changes: dict[str, list[Any]], source: str = "") -> None:
        """A resumed run changed ``changes`` ({key: [old, new]}) from ``step`` on: one line of config_changes.jsonl
        (config.yaml keeps the original), and a table in results.json/results.md when the run finishes."""
        entry = redact({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from": source, "changes": changes})
        self.changes.append(entry)
        if self.is_main:
            with open(self.dir / "config_changes.jsonl", "a") as f:
                f.write(dumps(entry) + "\n")

    def print(self, *args: Any) -> None:
        """A line of prose: the terminal wraps it (rich would break a path in the middle at the console's width)."""
        if self.is_main:
            if self._console is not None:
                self._console.print(*args, soft_wrap=True)
            else:
                print(*args)

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if not self.is_main:
            return
        row = redact({"step": step, "time_s": round(wall() - self.t0, 4), **metrics})
        assert self._metrics_f is not None
        self._metrics_f.write(dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        every = getattr(getattr(self.cfg, "logger", None), "log_every", 1)
        if self._console is not None and (step is None or step % every == 0):
            parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()]
            where = "" if step is None else f" step {step}"
            self._console.print(f"[dim]{self.job}[/]{where}: " + " | ".join(parts), highlight=False)

    def finish(
        self,
        rows: list[dict[str, Any]],
        predicted: dict[str, Any] | None = None,
        measured: dict[str, Any] | None = None,
        cost: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        tables: dict[str, list[dict[str, Any]]] | None = None,
        notes: dict[str, str] | None = None,
    ) -> Path:
        """Write results.json / results.md, close W&B, print the run dir (last line)."""
        if self.is_main:
            results: dict[str, Any] = {"job": self.job, "status": "complete", "rows": rows}
            for k, v in (
                ("predicted", predicted),
                ("measured", measured),
                ("cost", cost),
                ("tables", tables),
                ("notes", notes),
            ):
                if v:
                    results[k] = v
            results.update(extra or {})
            changes = [json.loads(line) for line in _lines(self.dir / "config_changes.jsonl")]
            if changes:  # every resume's changes, this one's and earlier ones'
                results["config_changes"] = changes
                results.setdefault("tables", {})["Config changes on resume (config.yaml: the original)"] = [
                    {"step": c["step"], "setting": k, "before": json.dumps(v[0]), "after": json.dumps(v[1])}
                    for c in changes
                    for k, v in c["changes"].items()
                ]
            results["wall_time_s"] = wall() - self.t0
            results = redact(json.loads(dumps(results)))
            self._write_results(results)
            (self.dir / RESERVE_FILE).unlink(missing_ok=True)
            plots = sorted(str(p.relative_to(self.dir)) for p in self.plots_dir.glob("*.png"))
            (self.dir / "results.md").write_text(render_markdown(results, plots))
            if self._console is not None and rows:  # fitted to the terminal width; results.md has everything
                text = format_rows(rows[:50], f"{self.job} results")
                self._console.print(text, markup=False, highlight=False, soft_wrap=True)
            self.close()
            print(f"run dir: {self.dir}", flush=True)
        return self.dir

    def _write_results(self, results: dict[str, Any]) -> None:
        tmp = self.dir / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=2))
        os.replace(tmp, self.dir / "results.json")

    def fail(self, error: str) -> None:
        """The run stopped on ``error``: results.json/results.md say ``status: failed`` and why (rank 0 only).

        On a full disk (no room for a new file) results.json is overwritten in place, within the bytes reserved
        when the run started; results.md is then best effort."""
        if self.is_main:
            results = redact({"job": self.job, "status": "failed", "error": error, "wall_time_s": wall() - self.t0})
            try:
                self._write_results(results)
            except OSError:
                (self.dir / "results.json.tmp").unlink(missing_ok=True)
                text = json.dumps({**results, "error": results["error"][: RESERVED_BYTES // 2]}).encode()
                with open(self.dir / RESERVE_FILE, "r+b") as f:  # no new blocks: the reserved ones are reused
                    f.write(text)
                    f.truncate(len(text))
                os.replace(self.dir / RESERVE_FILE, self.dir / "results.json")
            (self.dir / RESERVE_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (self.dir / "results.md").write_text(render_markdown(results))
        with contextlib.suppress(OSError):
            self.close()

    def close(self) -> None:
        if self in _OPEN:
            _OPEN.remove(self)
        if self._metrics_f is not None:
            self._metrics_f.close()
            self._metrics_f = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def trainer_log_callback(rec: RunRecord, rename: dict[str, str]) -> Any:
    """A transformers TrainerCallback forwarding every numeric Trainer log (TRL's loss, rewards/*, logps/*, eval_*)
    to ``rec`` at the Trainer's global step, with keys renamed to phase6's fixed metric names."""
    from transformers import TrainerCallback

    class _Forward(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs:
                rec.log(
                    {rename.get(k, k): v for k, v in logs.items() if isinstance(v, (int, float))},
                    step=state.global_step,
                )

    return _Forward()


def progress(transient: bool = False) -> Any:
    """A rich progress bar (description, bar, count, rate, ETA) for long loops; use as a context manager."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=transient,
    )


def read_results(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise ValueError(f"{path}: no results.json (not a finished phase6 run directory)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from e
    return out
