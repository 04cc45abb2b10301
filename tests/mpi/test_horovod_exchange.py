"""The Horovod exchange (allreduce_train/distributed/horovod.py): the refusal of controller / CPU-operation
settings that crash Horovod 0.28.1, the choice to connect through mpi4py before ``hvd.init()``, the
patched background threads that do not spin while idle, and ``--reduce-op adasum``."""

import json
import os
import re
import subprocess

import pytest
import torch

from allreduce_train.distributed.horovod import check_horovod_env, wants_connect_first
from allreduce_train.errors import UserError

from helpers import RANKS, ROOT, SHARED_RUN, check, launch, load_params, rel_diff, run_args


@pytest.mark.mpi
def test_trainer_refuses_gloo_cpu_operations_under_mpirun(tmp_path):
    proc = launch(
        2,
        ["--dataset", "synthetic", "--steps", "2", "--no-progress", "--run-dir", str(tmp_path)],
        env={"HOROVOD_CPU_OPERATIONS": "gloo"},
        timeout=120,
    )
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error:")]
    assert len(errors) == 1 and "HOROVOD_CPU_OPERATIONS=gloo" in errors[0], proc.stderr
    assert "Segmentation fault" not in proc.stderr


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"HOROVOD_CPU_OPERATIONS": "gloo"}, "HOROVOD_CPU_OPERATIONS=gloo"),
        ({"HOROVOD_CPU_OPERATIONS": "GLOO", "HOROVOD_CONTROLLER": "mpi"}, "HOROVOD_CPU_OPERATIONS=gloo"),
        ({"HOROVOD_CONTROLLER": "gloo"}, "MPI_ERR_COMM"),
        ({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}, "rendezvous"),
    ],
)
def test_crashing_horovod_combinations_are_refused(env, fragment):
    with pytest.raises(UserError, match=fragment):
        check_horovod_env(env)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"HOROVOD_CPU_OPERATIONS": "mpi"},
        {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"},
    ],
)
def test_working_horovod_combinations_pass(env):
    check_horovod_env(env)


ACROSS = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}


@pytest.mark.parametrize(
    "env, gloo, expected",
    [
        (ACROSS, False, True),  # ranks on several hosts, Horovod on MPI: exchange once before hvd.init()
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, False, False),  # one host
        ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, False, False),  # one rank
        ({}, False, False),  # not under mpirun
        (ACROSS, True, False),  # Gloo: no MPI traffic to order
        ({**ACROSS, "HOROVOD_CONTROLLER": "gloo"}, False, False),
        ({**ACROSS, "ALLREDUCE_TRAIN_CONNECT_FIRST": "0"}, False, False),
        (
            {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "ALLREDUCE_TRAIN_CONNECT_FIRST": "1"},
            False,
            True,
        ),
    ],
)
def test_connect_first_across_hosts_with_horovods_mpi_only(env, gloo, expected):
    assert wants_connect_first(env, gloo) is expected


def test_connect_first_bad_value_is_named():
    with pytest.raises(UserError, match="ALLREDUCE_TRAIN_CONNECT_FIRST='yes'"):
        wants_connect_first({**ACROSS, "ALLREDUCE_TRAIN_CONNECT_FIRST": "yes"}, False)


@pytest.mark.mpi
def test_horovod_background_threads_do_not_spin_while_idle():
    """tools/patches/horovod-0.28.1-cycle-phase.patch: unpatched, the ranks' background threads
    keep the phase offset they start with, and one of them busy-waits in every cycle's
    coordination collective: 95 % of a core while training nothing, on this machine."""
    from launch.mpirun import LaunchSpec, build_command

    env = {**os.environ, "PYTHONPATH": str(RANKS), "HOROVOD_CYCLE_TIME": "1"}  # Horovod's default
    cmd = build_command(LaunchSpec(np=2, module="horovod_idle_rank", trainer_args=["2"]), environ=env)
    proc = check(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120))
    # the ranks' lines may arrive interleaved on one line of mpirun's output
    ranks = [
        m.groupdict()
        for m in re.finditer(
            r"rank (?P<rank>\d+) size (?P<size>\d+) sum (?P<sum>\S+) "
            r"idle_s (?P<idle_s>[\d.]+) background_cpu_s (?P<background_cpu_s>[\d.]+)",
            proc.stdout,
        )
    ]
    assert len(ranks) == 2 and all(r["size"] == "2" and r["sum"] == "3" for r in ranks), proc.stdout
    for r in ranks:
        assert float(r["background_cpu_s"]) < 0.3 * float(r["idle_s"]), r


ADASUM = SHARED_RUN + ["--batch-size", "16", "--reduce-op", "adasum"]


@pytest.fixture(scope="module")
def adasum_dir(tmp_path_factory):
    """LeNet-5 with Adasum at 2 ranks, SHARED_RUN's 20 steps (a checkpoint every 7), run to the end."""
    d = tmp_path_factory.mktemp("adasum")
    check(launch(2, ADASUM + run_args(d, "full")))
    return d


def same_on_both_ranks(d, name):
    r0, r1 = load_params(d / f"{name}-0.pt"), load_params(d / f"{name}-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0), f"{name}: the ranks' parameters differ"
    return r0


@pytest.mark.mpi
def test_adasum_trains_lenet5_alike_on_both_ranks_and_not_as_an_average(adasum_dir, sync_run):
    got = same_on_both_ranks(adasum_dir, "full")
    assert rel_diff(got, load_params(sync_run / "sync-0.pt")) > 1e-2  # the updates were combined, not averaged
    evals = [e["eval_loss"] for e in json.loads((adasum_dir / "full" / "metrics.json").read_text())["evals"]]
    assert len(evals) == 2 and evals[1] < evals[0]


@pytest.mark.mpi
@pytest.mark.long  # two more jobs (~20 s): make test-long, .ci/run
def test_adasum_resumes_exactly_with_every_workers_own_momentum(tmp_path, adasum_dir):
    check(launch(2, ADASUM + run_args(tmp_path, "cut", "--exit-after-steps", "9")))
    check(launch(2, ADASUM + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(adasum_dir / "full-0.pt"), same_on_both_ranks(tmp_path, "cut")
    assert all(torch.equal(full[k], resumed[k]) for k in full)


@pytest.mark.mpi
@pytest.mark.long  # two one-step jobs (~20 s): make test-long, .ci/run
def test_one_adasum_step_combines_the_two_workers_updates_by_adasums_formula(tmp_path):
    """After one step each worker's own update is what ``--strategy none`` (each rank alone) makes from the
    same start; Adasum combines them per tensor as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b (Horovod's
    adasum.h), which is neither their mean nor their sum."""
    one = SHARED_RUN + ["--batch-size", "16", "--steps", "1"]
    check(launch(2, one + run_args(tmp_path, "ada", "--reduce-op", "adasum")))
    check(launch(2, one + run_args(tmp_path, "alone", "--strategy", "none")))
    from models import get_model

    torch.manual_seed(42)  # the trainer's --seed: the parameters every rank starts from
    start = get_model("lenet5").state_dict()
    got, own = same_on_both_ranks(tmp_path, "ada"), [load_params(tmp_path / f"alone-{r}.pt") for r in (0, 1)]
    off = {"formula": 0.0, "mean": 0.0, "sum": 0.0, "size": 0.0}  # squared distances over the whole model
    for k, p0 in start.items():
        a, b = ((w[k] - p0).double() for w in own)
        dot = (a * b).sum()
        want = (1 - dot / (2 * (a * a).sum())) * a + (1 - dot / (2 * (b * b).sum())) * b
        step = (got[k] - p0).double()
        assert (step - want).norm() <= 1e-4 * want.norm(), k  # float32 parameters less float32 start: ~1e-5
        for name, ref in (("formula", want), ("mean", (a + b) / 2), ("sum", a + b), ("size", 0 * a)):
            off[name] += float((step - ref).square().sum())
    # the updates are far from parallel, so Adasum is nearer their sum than their mean, and the formula's
    # correction to the sum is many times the tolerance above
    assert off["mean"] > 0.1 * off["size"] and off["sum"] > 1e-4 * off["size"] > 100 * off["formula"]


@pytest.mark.mpi
def test_adasum_at_a_number_of_ranks_horovod_cannot_combine_is_refused_in_one_line(tmp_path):
    proc = launch(
        3,
        ["--dataset", "synthetic", "--steps", "2", "--no-progress", "--run-dir", str(tmp_path)]
        + ["--reduce-op", "adasum"],
        oversubscribe=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert errors and all("power-of-2 number of ranks (this job has 3)" in ln for ln in errors), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.mpi
def test_adasum_on_horovods_gloo_is_refused_where_horovod_has_no_adasum_operation():
    proc = check(launch(2, [], module="adasum_gloo_rank", env={"PYTHONPATH": f"{RANKS}:{ROOT}"}, timeout=120))
    for rank in (0, 1):
        assert f"rank {rank} refused: --reduce-op adasum: Horovod runs Adasum over MPI only" in proc.stdout
        assert f"rank {rank} horovod: No Adasum operation enabled" in proc.stdout, proc.stdout
