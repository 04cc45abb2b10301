"""``--strategy ps`` with real ranks under mpirun: properties that hold only if the servers really
averaged, updated and answered (equality with ring allreduce and with plain torch SGD on the same
samples), plus async training, checkpoints, bad configurations and a stuck rank."""

import json

import pytest
import torch
import torch.nn.functional as F

from helpers import FASHION_MNIST_DIR, check, launch, load_params, needs_fashion_mnist, rel_diff

pytestmark = pytest.mark.mpi

# Warm-up on: the LR changes every step, so the servers must use the LR each push carries.
PS_RUN = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "2048",
    "--no-progress",
    "--log-every",
    "5",
    "--batch-size",
    "16",
    "--steps",
    "20",
    "--warmup-steps",
    "8",
    "--lr",
    "0.05",
]
# Several buckets (overlap path) and tensors split across servers.
SMALL_MESSAGES = ["--ps-bucket-bytes", "40000", "--ps-split-bytes", "16000"]


def run_args(tmp_path, name, *extra):
    return ["--run-dir", str(tmp_path), "--name", name, "--dump-params", str(tmp_path / f"{name}-{{rank}}.pt"), *extra]


def ps_launch(np, args, **kw):
    return launch(np, ["--strategy", "ps", *args], oversubscribe=True, **kw)


@pytest.fixture(scope="module")
def allreduce_params(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ar")
    check(launch(2, PS_RUN + run_args(tmp, "ar")))
    return load_params(tmp / "ar-0.pt")


# 2 servers, 2 workers; checkpoints every 7 steps (which must not change the result): the reference
# for the resume test as well.
K2 = ["--ps-placement", "dedicated", "--ps-servers", "2", "--checkpoint-every", "7", *SMALL_MESSAGES]


@pytest.fixture(scope="module")
def ps_k2_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k2")
    check(ps_launch(4, PS_RUN + K2 + run_args(tmp, "ps")))
    return tmp


@pytest.mark.parametrize(
    "np, placement",
    [
        (3, ["--ps-placement", "dedicated", "--ps-servers", "1"]),
        (4, K2),
        (2, ["--ps-placement", "colocated", *SMALL_MESSAGES]),
    ],
    ids=["dedicated-K1", "dedicated-K2", "colocated"],
)
def test_sync_ps_ends_where_allreduce_ends(request, tmp_path, allreduce_params, np, placement):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if placement is K2:
        tmp_path = request.getfixturevalue("ps_k2_dir")
    else:
        check(ps_launch(np, PS_RUN + placement + run_args(tmp_path, "ps")))
    m = json.loads((tmp_path / "ps" / "metrics.json").read_text())
    workers = range(np - 2, np)  # dedicated servers are the first ranks
    dumps = sorted(p.name for p in tmp_path.glob("ps-*.pt"))
    assert dumps == [f"ps-{r}.pt" for r in workers]  # servers do not run the training loop
    first = load_params(tmp_path / f"ps-{workers[0]}.pt")
    for r in workers:
        params = load_params(tmp_path / f"ps-{r}.pt")
        for k in params:
            assert torch.equal(params[k], first[k]), f"{k} differs on rank {r}"
    assert rel_diff(first, allreduce_params) <= 1e-5
    assert (m["strategy"], m["workers"], m["world_size"], m["global_batch"]) == ("ps", 2, np, 32)
    assert m["ps_mode"] == "sync" and m["staleness_max"] == 0
    assert m["ps_servers"] == (np if "colocated" in placement else np - 2)
    assert m["bytes_pushed_per_step"] == m["bytes_pulled_per_step"] >= 4 * sum(p.numel() for p in first.values())
    assert m["samples_per_sec"] > 0 and m["comm_wait_ms"] >= 0
    # the allreduce tags, the PS's own, one TensorBoard writer (the first worker's), in the run directory
    acc = EventAccumulator(str(tmp_path / "ps"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "perf/samples_per_sec",
        "perf/step_ms",
        "comm/wait_ms",
        "eval/loss",
        "eval/accuracy",
        "comm/bytes_pushed_per_step",
        "comm/bytes_pulled_per_step",
        "comm/staleness_mean",
        "comm/staleness_max",
    ):
        assert tag in tags, tag
    assert list((tmp_path / "ps").glob("events*"))
    assert not any(p.name.startswith("events") for p in tmp_path.iterdir())


def reference_sgd(steps, batch, lr, warmup, workers, momentum, weight_decay, clip, seed=42):
    """The same run in one process with plain torch SGD: global batch, the trainer's LR schedule."""
    from allreduce_train.data.images import ShardedBatches, synthetic
    from models import MODELS

    spec = MODELS["lenet5"]
    torch.manual_seed(seed)
    train_set, _ = synthetic(spec.input_shape, spec.num_classes, 2048, seed)
    model = spec.build()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    batches = ShardedBatches(train_set, batch * workers, 0, 1, seed)
    for step, (x, y) in zip(range(steps), batches.batches(0), strict=False):
        target = lr * workers
        opt.param_groups[0]["lr"] = target if step >= warmup else lr + (target - lr) * step / warmup
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_sync_ps_with_weight_decay_and_clipping_equals_plain_torch_sgd(tmp_path):
    """Weight decay, momentum and clipping by the global norm of the averaged gradient (summed over
    the servers) are applied on the servers, with the LR of each step."""
    check(
        ps_launch(
            4,
            PS_RUN
            + SMALL_MESSAGES
            + ["--ps-servers", "2", "--weight-decay", "1e-3", "--grad-clip", "0.3"]
            + run_args(tmp_path, "wd"),
        )
    )
    want = reference_sgd(steps=20, batch=16, lr=0.05, warmup=8, workers=2, momentum=0.9, weight_decay=1e-3, clip=0.3)
    assert rel_diff(load_params(tmp_path / "wd-2.pt"), want) <= 1e-5
    # the controls: without weight decay, or without clipping, the result is measurably different
    assert rel_diff(want, reference_sgd(20, 16, 0.05, 8, 2, 0.9, 0.0, 0.3)) > 1e-4
    assert rel_diff(want, reference_sgd(20, 16, 0.05, 8, 2, 0.9, 1e-3, 0.0)) > 1e-4


def test_resume_continues_exactly_with_momentum_from_the_servers(tmp_path, ps_k2_dir):
    check(ps_launch(4, PS_RUN + K2 + run_args(tmp_path, "cut", "--exit-after-steps", "9")))
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 9 and saved["optimizer"]["state"]  # the servers' momentum, gathered
    check(ps_launch(4, PS_RUN + K2 + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(ps_k2_dir / "ps-2.pt"), load_params(tmp_path / "cut-2.pt")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


@needs_fashion_mnist
@pytest.mark.parametrize(
    "np, placement",
    [
        pytest.param(3, "dedicated", marks=pytest.mark.long),  # make test under 20 min: the long tier (CI runs it)
        # make test-long: tests/mpi/test_tta.py trains the asynchronous colocated PS on Fashion-MNIST to a
        # target and checks its staleness
        pytest.param(2, "colocated", marks=pytest.mark.long),
    ],
)
def test_async_trains_on_fashion_mnist_and_logs_staleness(tmp_path, np, placement):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    check(
        ps_launch(
            np,
            [
                "--ps-mode",
                "async",
                "--ps-placement",
                placement,
                "--run-dir",
                str(tmp_path),
                "--name",
                "async",
                "--steps",
                "150",
                "--no-progress",
                "--log-every",
                "10",
                "--eval-every",
                "150",
                "--data-dir",
                FASHION_MNIST_DIR,
            ],
        )
    )
    acc = EventAccumulator(str(tmp_path / "async"))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert losses[-1] < 0.6 * losses[0]
    staleness = [e.value for e in acc.Scalars("comm/staleness_mean")]
    assert len(staleness) == 15 and all(s >= 0 for s in staleness)
    m = json.loads((tmp_path / "async" / "metrics.json").read_text())
    assert m["ps_mode"] == "async" and m["final"]["eval_accuracy"] > 0.5  # 10 classes
    # the other worker's updates landed between this worker's pull and push: not lock-step sync
    assert m["staleness_max"] >= 1 and m["staleness_mean"] > 0


@pytest.mark.parametrize(
    "np, args, needle",
    [
        (2, ["--ps-servers", "3"], "--ps-servers 3"),
        (2, ["--ps-servers", "2"], "leaves no worker"),
        (2, ["--ps-placement", "colocated", "--ps-servers", "1"], "--ps-placement colocated"),
    ],
)
def test_bad_config_one_line_nonzero_exit_no_hang(tmp_path, np, args, needle):
    proc = ps_launch(np, ["--dataset", "synthetic", "--run-dir", str(tmp_path), *args], timeout=90)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(ours) == 1, proc.stderr
    assert needle in ours[0]
