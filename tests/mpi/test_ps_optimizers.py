"""The parameter server runs the user's optimizer on its servers' shards, not only SGD: AdamW with a
group without weight decay, a cosine schedule and bf16 autocast through the trainer, and an Optimizer
class of a user's own script driven by a torch LR scheduler through :func:`allreduce_train.init`.
Properties that hold only if the servers really stepped that optimizer on their slices: equality,
bit for bit, with the mpi engine's ring running the same optimizer on the workers (parameters and
every piece of the optimizer's state), a resume on another server count that continues exactly,
and an asynchronous run whose state counts every worker's pushes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import helpers
from helpers import (
    ENGINE_RUN,
    FASHION_MNIST_DIR,
    RANKS,
    ROOT,
    check,
    launch,
    load_params,
    needs_fashion_mnist,
    run_args,
)

pytestmark = pytest.mark.mpi

# helpers.RECIPE (AdamW, a second group without decay, a cosine after 4 warm-up steps: every step's LR differs,
# so each push must carry it; bf16 autocast on the workers) on ENGINE_RUN: 12 steps of batch 8 on LeNet-5, a
# checkpoint every 5 (and at the end).
RECIPE = ENGINE_RUN + helpers.RECIPE
# Several buckets, and LeNet-5's largest tensors (48,000 and 10,080 elements) split into chunks of 4,000
# elements across the servers: chunks of Adam's moments live on different servers.
SMALL = ["--ps-bucket-bytes", "40000", "--ps-split-bytes", "16000"]
DEDICATED = ["--strategy", "ps", "--ps-placement", "dedicated", "--ps-servers", "2", *SMALL]  # 4 ranks: 2 serve
COLOCATED = ["--strategy", "ps", "--ps-placement", "colocated", *SMALL]
WORKERS = {"ring": (0, 1), "dedicated": (2, 3), "colocated": (0, 1)}


def same_on_every_worker(d, name: str) -> dict[str, torch.Tensor]:
    first, *others = WORKERS[name]
    params = load_params(d / f"{name}-{first}.pt")
    for r in others:
        other = load_params(d / f"{name}-{r}.pt")
        for k in params:
            assert torch.equal(params[k], other[k]), f"{name}: {k} differs between rank {first} and rank {r}"
    return params


def saved(d, name: str) -> dict:
    return torch.load(d / name / "checkpoint.pt", weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 12 steps on the mpi engine's ring (AdamW on the workers: the reference), on 2 dedicated
    servers and on the colocated PS (AdamW on the servers' shards); run NAME in one folder."""
    d = tmp_path_factory.mktemp("psopt")
    check(launch(2, RECIPE + ["--allreduce-engine", "mpi"] + run_args(d, "ring")))
    check(launch(4, RECIPE + DEDICATED + run_args(d, "dedicated"), oversubscribe=True))
    check(launch(2, RECIPE + COLOCATED + run_args(d, "colocated")))
    return d


@pytest.mark.parametrize("name", ["dedicated", "colocated"])
def test_sync_ps_with_adamw_ends_bit_for_bit_where_the_ring_ends(runs, name):
    """Adam's update of an element reads only that element, its gradient and its moments, so a server's
    chunk steps exactly as the whole tensor does on a worker; the average of two float32 gradients is
    the same bits in any order. So the parameters, and the moments and step count gathered from the
    servers into the checkpoint, are the ring's exactly."""
    ring, got = same_on_every_worker(runs, "ring"), same_on_every_worker(runs, name)
    for k in ring:
        assert torch.equal(got[k], ring[k]), f"{name}: {k} differs from the ring's"
    want, have = saved(runs, "ring")["optimizer"], saved(runs, name)["optimizer"]
    assert [g["params"] for g in have["param_groups"]] == [g["params"] for g in want["param_groups"]]
    assert [g["weight_decay"] for g in have["param_groups"]] == [0.1, 0.0]  # the no-decay group
    assert [g["lr"] for g in have["param_groups"]] == [g["lr"] for g in want["param_groups"]]
    assert want["state"].keys() == have["state"].keys() == set(range(10))
    for i, st in want["state"].items():
        assert st.keys() == have["state"][i].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in st.items():
            assert torch.equal(have["state"][i][key], value), f"{name}: state {i} {key}"
    m = json.loads((runs / name / "metrics.json").read_text())
    assert (m["optimizer"], m["ps_mode"], m["precision"]) == ("AdamW", "sync", "bf16-mixed")


def test_the_checkpoints_optimizer_state_loads_into_plain_torch_adamw(runs):
    """The servers' state comes back in AdamW's own state_dict format over the model's parameters."""
    from models import MODELS

    model = MODELS["lenet5"].build()
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups: list[dict[str, Any]] = [{"params": matrices}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups)
    opt.load_state_dict(saved(runs, "dedicated")["optimizer"])
    for p in model.parameters():
        assert opt.state[p]["exp_avg"].shape == p.shape and float(opt.state[p]["step"]) == 12
        p.grad = torch.ones_like(p)
    opt.step()  # a plain AdamW continues from it


def test_each_server_holds_its_share_of_adams_state_twice_its_parameters(runs):
    """metrics.json: Adam's two moments are 2x the parameters' bytes, spread over the servers as the
    parameters are (plus a 4-byte step count per segment)."""
    m = json.loads((runs / "dedicated" / "metrics.json").read_text())
    params, state = m["ps_server_bytes"], m["ps_server_state_bytes"]
    numel = sum(p.numel() for p in load_params(runs / "dedicated-2.pt").values())
    assert len(params) == len(state) == 2 and sum(params) == 4 * numel
    for p, s in zip(params, state, strict=True):
        assert 2 * p <= s <= 2 * p + 4 * 64 and p < 4 * numel


def test_memory_per_rank_counts_what_each_concept_holds(runs):
    """metrics.json ``memory`` (and TensorBoard ``memory/``): the ring holds every parameter, gradient
    and AdamW's two moments (exactly 2x the parameters' bytes, plus a 4-byte step count per tensor) on
    every rank, beside its buckets; a dedicated PS's workers hold no optimizer state, its servers
    the float32 master parameters and the moments between them; a colocated rank holds its worker's
    model and a shard of both."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    numel = sum(p.numel() for p in load_params(runs / "ring-0.pt").values())
    tensors = len(load_params(runs / "ring-0.pt"))  # LeNet-5: no buffers, so every entry is a parameter
    rows = {}
    for name, ranks in (("ring", 2), ("dedicated", 4), ("colocated", 2)):
        memory = json.loads((runs / name / "metrics.json").read_text())["memory"]
        for when in ("after_first_step", "end"):
            assert [r["rank"] for r in memory[when]] == list(range(ranks)), (name, when)
            for r in memory[when]:
                assert {"params", "grads", "optimizer", "buffers", "total", "peak_rss_mib"} <= r.keys()
                assert r["total"] == r["params"] + r["grads"] + r["optimizer"] + r["buffers"] and r["peak_rss_mib"] > 0
        rows[name] = memory["end"]
    for r in rows["ring"]:
        assert (r["params"], r["grads"]) == (4 * numel, 4 * numel)
        assert r["optimizer"] == 2 * r["params"] + 4 * tensors
        assert r["buffers"] >= 4 * numel  # the buckets: every gradient once, and the ring's receive scratch
    servers, workers = rows["dedicated"][:2], rows["dedicated"][2:]
    assert [r["role"] for r in rows["dedicated"]] == ["server", "server", "worker", "worker"]
    for r in workers:
        assert (r["params"], r["grads"], r["optimizer"]) == (4 * numel, 4 * numel, 0)
    assert sum(r["params"] for r in servers) == 4 * numel and all(r["grads"] == 0 for r in servers)
    m = json.loads((runs / "dedicated" / "metrics.json").read_text())
    assert [r["optimizer"] for r in servers] == m["ps_server_state_bytes"]
    state = sum(r["optimizer"] for r in servers)
    assert 8 * numel < state <= 8 * numel + 4 * 64  # the moments, and a step count per segment
    master = [r["params"] - 4 * numel for r in rows["colocated"]]  # beside each worker's own model
    assert sum(master) == 4 * numel and all(0 < b < 4 * numel for b in master)
    state = sum(r["optimizer"] for r in rows["colocated"])
    assert 8 * numel < state <= 8 * numel + 4 * 64
    assert all(r["optimizer"] < rows["ring"][0]["optimizer"] for r in rows["colocated"])
    acc = EventAccumulator(str(runs / "ring"))
    acc.Reload()
    for kind in ("params", "grads", "optimizer", "buffers"):
        first, last = acc.Scalars(f"memory/{kind}_bytes/rank1")[0], acc.Scalars(f"memory/{kind}_bytes/rank1")[-1]
        assert first.step == 1 and last.value == rows["ring"][1][kind]
    assert acc.Scalars("memory/peak_rss_mib/rank0")[-1].value > 0


@pytest.mark.long  # 2 jobs (~20 s); the same-count resume of every concept is in make test
def test_resume_on_another_server_count_continues_bit_for_bit(runs, tmp_path):
    """Cut at step 5 on 2 dedicated servers; resumed on 1: the one server gets the whole of the
    moments the two held, and the run ends where the uncut one (and the ring) ended."""
    check(launch(4, RECIPE + DEDICATED + run_args(tmp_path, "cut", "--exit-after-steps", "5"), oversubscribe=True))
    cut = saved(tmp_path, "cut")
    assert cut["step"] == 5 and float(cut["optimizer"]["state"][0]["step"]) == 5
    one = ["--ps-servers", "1"]  # after DEDICATED's 2: the later flag wins
    check(launch(3, RECIPE + DEDICATED + one + run_args(tmp_path, "cut", "--resume", "auto"), oversubscribe=True))
    full = same_on_every_worker(runs, "dedicated")
    for r in (1, 2):
        resumed = load_params(tmp_path / f"cut-{r}.pt")
        for k in full:
            assert torch.equal(resumed[k], full[k]), f"rank {r}: {k}"


@needs_fashion_mnist
@pytest.mark.long  # about a minute: real data, to show the loss falling
def test_async_ps_with_adamw_trains_and_its_state_counts_every_workers_pushes(tmp_path):
    """Each push is a step of the server's AdamW: after 40 steps of 2 workers every parameter's step
    count is 80 (in the checkpoint at the end, which waits for both workers' last replies); the training
    loss falls on Fashion-MNIST, and the one-group state loads into ``torch.optim.AdamW(model.parameters())``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from models import MODELS

    flags = ["--data-dir", FASHION_MNIST_DIR, "--no-progress", "--batch-size", "32", "--steps", "40"]
    flags += ["--log-every", "5", "--eval-every", "40", "--warmup-steps", "0", "--optimizer", "adamw", "--lr", "0.001"]
    ps = ["--strategy", "ps", "--ps-mode", "async", "--ps-servers", "1"]
    check(launch(3, flags + ps + run_args(tmp_path, "async"), oversubscribe=True))
    acc = EventAccumulator(str(tmp_path / "async"))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert losses[-1] < 0.6 * losses[0], losses
    state = saved(tmp_path, "async")["optimizer"]
    assert {float(st["step"]) for st in state["state"].values()} == {80.0}
    model = MODELS["lenet5"].build()
    torch.optim.AdamW(model.parameters()).load_state_dict(state)
    m = json.loads((tmp_path / "async" / "metrics.json").read_text())
    assert (m["ps_mode"], m["optimizer"]) == ("async", "AdamW") and m["final"]["eval_accuracy"] > 0.3  # 10 classes


def test_a_users_own_optimizer_class_and_lr_scheduler_run_on_the_servers(tmp_path):
    """tests/ranks/ps_optim_rank.py: an Optimizer subclass defined in the script itself (state: a
    tensor per element and a plain int), its LR halved by torch's StepLR every 4 steps on the
    DistributedOptimizer; the colocated PS with a tensor split across servers ends where the ring ends,
    bit for bit, with the same state."""
    env = {"PYTHONPATH": f"{RANKS}:{ROOT}"}
    flags = ["--optimizer", "own", "--steps", "10", "--lr", "0.01", "--batch-size", "16"]
    for name, how in (("ring", ["--allreduce-engine", "mpi"]), ("colocated", COLOCATED)):
        out = check(
            launch(
                2,
                [*flags, *how, "--dump-params", str(tmp_path / f"{name}-{{rank}}.pt"), "--state", str(tmp_path / name)],
                module="ps_optim_rank",
                env=env,
            )
        )
        assert "lr 0.00025, a SignMomentum: True" in out.stdout  # 0.01 / 10 halved twice; isinstance holds
    ring, got = same_on_every_worker(tmp_path, "ring"), same_on_every_worker(tmp_path, "colocated")
    for k in ring:
        assert torch.equal(got[k], ring[k]), k
    want, have = (torch.load(tmp_path / n, weights_only=True)["optimizer"]["state"] for n in ("ring", "colocated"))
    assert want.keys() == have.keys()
    for i, st in want.items():
        assert have[i]["updates"] == st["updates"] == 10 and torch.equal(have[i]["m"], st["m"])


def test_an_optimizer_the_servers_cannot_build_ends_the_job_with_its_reason(tmp_path):
    """A constructor that needs more than its parameter groups (the servers build the class from them
    alone): the trainer checks it at set-up on every worker, before any message, so the job ends at once
    with one line naming the fix, exit 2, no traceback (tests/unit/test_ps_optimizer.py: the other refusals)."""
    flags = ["--dataset", "synthetic", "--steps", "3", "--no-progress", "--run-dir", str(tmp_path)]
    out = launch(2, flags + COLOCATED + ["--optimizer", "ps_optim_rank:needy"], env={"PYTHONPATH": f"{RANKS}:{ROOT}"})
    assert out.returncode == 2, out.stderr
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(said) == 1 and all("(Needy(param_groups)), which failed" in ln for ln in said), out.stderr
    assert "Traceback" not in out.stderr
