"""torchrun on 2 CPU ranks (gloo): DDP with the global batch split over the ranks trains like one process with the
whole batch, FSDP2 trains like DDP, and only rank 0 writes the run's files."""
import json
import sys
import threading
from pathlib import Path

import pytest

from train_template import checkpoint, train
from helpers import FAULTS, SHARD, TINY, cfg_of, child_env, launch, sets, train_records

# 2 epochs of 16 steps; global batch 64 (32 per rank); no dropout, whose masks differ between ranks and one process.
RUN = {**TINY, "data.synthetic.size": 1024, "train.batch_size": 64, "model.mlp.dropout": 0.0}


def torchrun(values: dict, run_dir: Path, audit: Path, results: dict) -> threading.Thread:
    """faults.py (train.py with drills) under torchrun, recording every file each rank writes into `audit`, started
    in a thread; its (exit code, output) lands in results[run_dir]."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *FAULTS, "--set", *sets({**values, "run.out_dir": str(run_dir)})]
    env = child_env(OMP_NUM_THREADS="1", TEMPLATE_FAULTS=f"audit_writes={audit}")

    def run() -> None:
        results[run_dir] = launch(cmd, env=env)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The DDP and the FSDP2 job at once, and the single process in this one meanwhile: their start-ups and
    rendezvous overlap (each job's ranks compute in one thread)."""
    tmp, results, jobs = tmp_path_factory.mktemp("dist"), {}, []
    for strategy in ("ddp", "fsdp"):
        (tmp / f"audit-{strategy}").mkdir()
        jobs.append(torchrun({**RUN, "train.strategy": strategy}, tmp / strategy, tmp / f"audit-{strategy}", results))
    train.run(cfg_of(RUN, tmp / "single"))
    for job in jobs:
        job.join()
    for code, text in results.values():
        assert code == 0, text[-3000:]
    return tmp


def max_loss_diff(a: Path, b: Path) -> float:
    ra, rb = train_records(a), train_records(b)
    assert ra.keys() == rb.keys()
    return max(abs(ra[s]["loss"] - rb[s]["loss"]) for s in ra)


def test_ddp_on_2_ranks_of_batch_b_trains_like_one_process_of_batch_2b(runs):
    assert max_loss_diff(runs / "ddp", runs / "single") <= 1e-5
    a, b = (checkpoint.load(runs / run / "last.pt")["model"] for run in ("ddp", "single"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-4


def test_fsdp_trains_like_ddp(runs):
    assert max_loss_diff(runs / "fsdp", runs / "ddp") <= 1e-5


def test_only_rank_0_writes_the_run_files_and_each_rank_its_own_checkpoint_shards(runs):
    def written(strategy: str, rank: int) -> list[str]:
        audit = runs / f"audit-{strategy}" / f"audit-rank{rank}.json"
        return [w for w in json.loads(audit.read_text())["writes"] if w.startswith(str(runs / strategy))]

    assert written("ddp", 0) and written("ddp", 1) == []
    assert written("fsdp", 1) and [w for w in written("fsdp", 1) if not SHARD.fullmatch(w)] == []
