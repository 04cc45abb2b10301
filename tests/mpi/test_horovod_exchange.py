"""The Horovod exchange (allreduce_train/distributed/horovod.py): the refusal of controller / CPU-operation
settings that crash Horovod 0.28.1, the choice to connect through mpi4py before ``hvd.init()``, and the
patched background threads that do not spin while idle."""

import os
import re
import subprocess

import pytest

from allreduce_train.distributed.horovod import check_horovod_env, wants_connect_first
from allreduce_train.errors import UserError

from helpers import RANKS, check, launch


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
    cmd = build_command(LaunchSpec(np=2, module="horovod_idle_rank", module_args=["2"]), environ=env)
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
