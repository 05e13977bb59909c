"""Compose, validate and run a job through Hydra (single run or ``-m`` sweep).

Every sweep member is composed and validated *before* the first one starts, so a typo in the last value of a
sweep fails in a second, not at hour 3. Errors are one line naming the key, exit code 2.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from phase6.config import CONFIG_DIR, JOBS, key_hint, load_object, to_dataclass
from phase6.errors import EXIT_USER_ERROR, UserError, one_line
from phase6.redact import RedactingStream, redact_logging

EXIT_CONFIG_ERROR = EXIT_USER_ERROR
ConfigError = UserError
"""A user mistake in the config or overrides: the one user-error type (phase6.errors.UserError)."""
DEBUG_ENV = "PHASE6_DEBUG"
"""Set to 1 to see the traceback of a user error instead of its one line."""


class _JobAbort(BaseException):
    """Carries a user error out of ``hydra.main`` (which turns every ``Exception`` into a traceback and exit 1)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def resumes(cfg: Any) -> bool:
    """Whether a run continues the records already in its run directory (pretrain's ``train.resume``)."""
    return bool(getattr(getattr(cfg, "train", None), "resume", None))


def _first_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).strip().splitlines()[:1])


def _explain(exc: BaseException, job: str | None = None) -> str:
    """One line naming the key for OmegaConf / Hydra / our own ValueError messages; an unknown key of ``job`` also
    gets its new name when it was renamed, or the closest field ("did you mean ...?")."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:  # the deepest exception that knows its key wins
        key = getattr(e, "full_key", None)
        if key:
            msg = _first_line(str(e).split("\n    full_key")[0])
            hint = key_hint(job, key) if job and isinstance(e, (ConfigKeyError, ConfigAttributeError)) else ""
            return f"{key}: {msg}" + (f"; {hint}" if hint else "")
    msgs = [_first_line(str(e)) for e in chain if str(e).strip()]
    return " / ".join(dict.fromkeys(msgs)) or type(exc).__name__


def job_overrides(job: str, overrides: list[str]) -> list[str]:
    """Put the job's own group folder (configs/<job>/) on Hydra's search path, ahead of the user overrides."""
    own = CONFIG_DIR / job
    extra = [f"hydra.searchpath=[file://{own}]"] if own.is_dir() else []
    return extra + list(overrides)


def job_groups(job: str) -> dict[str, list[str]]:
    """The config groups in ``job``'s defaults list -> the options each one has (YAML names, sorted).

    A group's options are the YAML files under ``configs/<job>/<group>/`` (the job's own) and ``configs/<group>/``
    (shared: hardware, logger, prices), found the way Hydra's search path finds them.
    """
    primary = OmegaConf.load(CONFIG_DIR / f"{job}.yaml")
    groups: dict[str, list[str]] = {}
    for entry in primary.get("defaults", []):
        if not isinstance(entry, DictConfig):  # `_self_`
            continue
        for key in entry:
            group = str(key).split()[-1].split("@")[0]  # "optional experiment" -> experiment; "x@pkg" -> x
            options: set[str] = set()
            for base in (CONFIG_DIR / job / group, CONFIG_DIR / group):
                if base.is_dir():
                    options.update(str(f.relative_to(base).with_suffix("")) for f in base.rglob("*.yaml"))
            groups[group] = sorted(options)
    return groups


def check_group_choices(job: str, overrides: list[str]) -> None:
    """An option that does not exist for a config group is an error, also for ``optional`` groups.

    Hydra's ``- optional experiment: null`` skips a missing option without a word, so ``experiment=<typo>`` would
    run the default job; and a group that the job does not have at all gets an error naming the job's groups.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:
        raise ConfigError(_explain(e)) from e
    groups = job_groups(job)
    other_groups = {d.name for j in JOBS for d in (CONFIG_DIR / j).glob("*/") if d.is_dir()}
    fields = set(getattr(load_object(JOBS[job].schema), "__dataclass_fields__", {}))
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra.") or o.is_delete():
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        if key not in groups:
            if key in other_groups and key not in fields:
                raise ConfigError(
                    f"{key}={','.join(map(str, values))}: {job} has no config group {key!r}; "
                    f"its groups: {', '.join(sorted(groups))}"
                )
            continue
        for value in values:
            if value is None or value == "null" or not isinstance(value, str) or value in groups[key]:
                continue
            if not groups[key]:
                raise ConfigError(f"{key}={value}: {job} has no {key} presets")
            raise ConfigError(f"{key}={value}: no such {key} for {job}; choose from {', '.join(groups[key])}")


def compose(job: str, overrides: list[str]) -> DictConfig:
    """Compose one (non-sweep) config for ``job`` with Hydra's compose API."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if job not in JOBS:
        raise ConfigError(f"unknown job {job!r}; known: {', '.join(sorted(JOBS))}")
    check_group_choices(job, overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return hydra_compose(config_name=job, overrides=job_overrides(job, overrides))
    except Exception as e:  # Hydra wraps every composition problem; keep only the key and the reason
        raise ConfigError(_explain(e, job)) from e
    finally:
        GlobalHydra.instance().clear()


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Cartesian product of sweep overrides (``a=1,2 b=x,y``), exactly as Hydra's basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:
        raise ConfigError(_explain(e)) from e
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [list(job) for batch in batches for job in batch]


def load_config(job: str, overrides: list[str]) -> Any:
    """Compose + validate one config into the job's dataclass, then run the job's own check (JobSpec.check) on it
    (what tests and `phase6 config` use)."""
    cfg = compose(job, overrides)
    try:
        out = to_dataclass(job, cfg)
        if JOBS[job].check:
            load_object(JOBS[job].check)(out)
        return out
    except Exception as e:
        raise ConfigError(_explain(e, job)) from e


def preflight(job: str, overrides: list[str], multirun: bool) -> list[Any]:
    """Validate every member of the run or sweep; returns their dataclasses."""
    members = expand_sweep(overrides) if multirun else [overrides]
    return [load_config(job, m) for m in members]


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def default_run_dir(job: str, name: str) -> str:
    return str(Path("outputs") / job / f"{_stamp()}_{name}")


_STORES: list[Any] = []  # rank 0's store client stays alive until the others have read the key


def agree_across_ranks(decide: Callable[[], list[str]]) -> list[str]:
    """``decide()`` on rank 0; under torchrun the other ranks receive its answer instead of deciding again.

    The answer travels through torchrun's own rendezvous store: the TCPStore at MASTER_ADDR:MASTER_PORT that every
    worker already reaches (hosted by the torchrun agent, or by rank 0 when TORCHELASTIC_USE_AGENT_STORE is not
    True, as init_process_group does). Nothing is guessed per rank: no clocks, no /proc. A user error on rank 0
    (a refused run.dir) is sent as well, so every rank stops with the same one line instead of waiting.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return decide()
    import json
    from datetime import timedelta

    from torch.distributed import TCPStore

    rank = int(os.environ["RANK"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_store,
        multi_tenant=True,  # init_process_group later reuses this server instead of binding the port again
        timeout=timedelta(seconds=600),
    )
    key = f"phase6/run_dir/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if rank == 0:
        _STORES.append(store)
        try:
            value = decide()
        except UserError as e:
            store.set(key, json.dumps({"error": str(e)}))
            raise
        store.set(key, json.dumps({"value": value}))
        return value
    answer = json.loads(store.get(key))
    if "error" in answer:
        raise UserError(answer["error"])
    return answer["value"]


def run_job(job: str, overrides: list[str], multirun: bool = False, main: Callable[[Any], Any] | None = None) -> None:
    """Validate, then hand over to ``hydra.main`` (so Hydra's sweeper/launcher plugins apply to ``-m``)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from phase6.runrecord import claim_run_dir, mark_failed, unlock_run_dir

    configs = preflight(job, overrides, multirun)
    if JOBS[job].preflight and main is None:
        check = load_object(JOBS[job].preflight)
        try:
            for c in configs:
                check(c)
        except ValueError as e:  # UserError and the input checks' ValueError: one line, exit 2
            if os.environ.get(DEBUG_ENV):
                raise
            raise UserError(one_line(e)) from e
    main_fn = main or load_object(JOBS[job].main)
    first = configs[0]

    def decide() -> list[str]:
        """The run directory (and a sweep's), decided here once; jobs read it from cfg.run.dir."""
        # a default (timestamped) directory never collides with a run started in the same second: it gets a suffix
        run_dir = first.run.dir or _fresh(default_run_dir(job, first.run.name))
        sweep_dir = first.run.dir or _fresh(str(Path("outputs") / job / f"sweep_{_stamp()}_{first.run.name}"))
        # another run's records in the target: refused (or moved aside), before anything is built or written
        target = Path(sweep_dir if multirun else run_dir)
        existed.append(target.exists())
        resumable = hasattr(getattr(first, "train", None), "resume")  # only pretrain has train.resume
        claim_run_dir(
            target, overwrite=first.run.overwrite, resume=all(resumes(c) for c in configs), resumable=resumable
        )
        return [run_dir, sweep_dir]

    existed: list[bool] = []  # rank 0 only: whether the target was there before (kept if the run fails early)
    run_dir, sweep_dir = agree_across_ranks(decide)
    target_existed = existed[0] if existed else True
    target = Path(sweep_dir if multirun else run_dir)
    hydra_args = [
        f"hydra.run.dir={run_dir}",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweep.subdir=${hydra.job.num}",
        "hydra.output_subdir=null",  # our config.yaml is the redacted record; Hydra's copy would leak secrets
        "hydra.job.chdir=false",
        "+hydra.callbacks.phase6_sweep._target_=phase6.report.SweepSummaryCallback",
    ]

    @hydra.main(config_path=str(CONFIG_DIR), config_name=job, version_base="1.3")
    def _task(cfg: DictConfig) -> Any:
        hc = HydraConfig.get()
        redact_logging()  # Hydra's <run dir>/launch.log and the console handlers
        OmegaConf.set_struct(cfg, False)
        cfg.run.dir = hc.runtime.output_dir
        # what this member of a sweep overrides, handed down as data for env.json and the sweep summary
        cfg.run.overrides = [o for o in hc.overrides.task if not o.startswith("hydra.")]
        try:
            return main_fn(to_dataclass(job, cfg))
        except ValueError as e:  # UserError and the code base's input checks (ValueError naming the key or file)
            mark_failed(e)
            if os.environ.get(DEBUG_ENV):
                raise
            raise _JobAbort(e) from e
        except OSError as e:
            user = os_error(e)  # the disk, the permissions or the port: the user's to fix, not a crash
            mark_failed(user or e)
            if user is None or os.environ.get(DEBUG_ENV):
                raise
            raise _JobAbort(user) from e
        except BaseException as e:  # a crash: the run dir says so, Hydra prints the traceback
            mark_failed(e)
            raise

    # hydra.main reads its overrides and -m from sys.argv only: it is the one public entry that runs Hydra's sweeper
    # and launcher plugins (the compose API makes one config), so the argv is swapped for the call and restored
    # Hydra echoes the overrides on stdout/stderr itself ("Error executing job with overrides: [...]", a sweep's
    # "#0 : ..." lines): both streams go through the redaction while it runs.
    argv, streams = sys.argv, (sys.stdout, sys.stderr)
    sys.argv = [f"phase6-{job}", *job_overrides(job, hydra_args + list(overrides)), *(["-m"] if multirun else [])]
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        try:
            _task()
        finally:  # the lock goes first: a failed run's directory is removed below only if nothing else is left
            sys.argv = argv
            sys.stdout, sys.stderr = streams
            unlock_run_dir(target)
    except _JobAbort as abort:
        _remove_if_empty(target, target_existed)
        raise UserError(one_line(abort.error)) from abort.error
    except BaseException:
        _remove_if_empty(target, target_existed)
        raise


OS_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EACCES: "not writable by this user",
    errno.EPERM: "not permitted",
    errno.EROFS: "read-only file system",
    errno.EADDRINUSE: "the address is already in use",
    errno.EMFILE: "too many open files (ulimit -n)",
}
"""OS errors that are the environment's, not a bug: the job stops with one line naming the file, exit 2."""


def os_error(e: OSError) -> UserError | None:
    """A UserError naming the file and the reason for an OS error in ``OS_ERRORS``; None for any other."""
    if e.errno not in OS_ERRORS:
        return None
    where = e.filename if e.filename is not None else "run"
    return UserError(f"{where}: {e.strerror or OS_ERRORS[e.errno]} ({errno.errorcode[e.errno]}: {OS_ERRORS[e.errno]})")


def _fresh(path: str) -> str:
    """``path``, or ``path-1``, ``path-2``, ... : the first that holds no run records and no writer's lock."""
    from phase6.runrecord import LOCK_FILE, run_records

    candidate, n = path, 1
    while run_records(Path(candidate)) or (Path(candidate) / LOCK_FILE).exists():
        candidate, n = f"{path}-{n}", n + 1
    return candidate


def _remove_if_empty(path: Path, existed: bool) -> None:
    """A run that failed before writing anything leaves no directory behind (Hydra creates it up front)."""
    if existed or int(os.environ.get("RANK", "0")) != 0 or not path.is_dir():
        return
    try:
        for f in path.glob("*.log"):  # Hydra's job log, created with the directory; empty unless something logged
            if f.stat().st_size == 0:
                f.unlink()
        path.rmdir()  # only succeeds when nothing else is there
    except OSError:
        pass
