"""phase6.dist.teardown frees a fully_shard model's reference cycles before the process group goes.

CI once saw a rank of a finished 2-process FSDP2 run abort at exit ("terminate called without an active exception"):
the sharded modules, their DeviceMesh and the Gloo group they hold lived in cycles until interpreter finalization.
This runs a world of one in a subprocess (its own process group, its own exit) and checks that no FSDPModule is
alive after teardown and that the process exits 0.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import gc, os, sys
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from phase6.dist import init_distributed, teardown

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)  # no port to race for
    info = init_distributed("cpu")

    def run():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()

    gc.disable()  # the cycle collector runs only when teardown asks for it, as late in a run as it can be
    run()
    alive_before = sum(isinstance(o, FSDPModule) for o in gc.get_objects())
    teardown()
    alive_after = sum(isinstance(o, FSDPModule) for o in gc.get_objects())
    print(alive_before, alive_after, dist.is_initialized())
    """
)


def test_teardown_frees_fsdp2_cycles_before_the_group_goes(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after, initialized = proc.stdout.split()[-3:]
    assert int(before) == 3, proc.stdout  # the root and its two layers, held by their own cycles
    assert int(after) == 0 and initialized == "False", proc.stdout
