"""The communication-reduction concepts' pieces that need no second rank (docs/concepts.md)."""

import pytest
import torch

from allreduce_train.distributed import buffers, compression, make_schedule, wirecost
from allreduce_train.distributed.local import LocalExchange
from allreduce_train.distributed.localsgd import LocalSGD, bytes_per_step
from allreduce_train.distributed.ps.server import HEADER_BYTES, message
from allreduce_train.distributed.wire import WireFormat, make_wire
from allreduce_train.errors import ConfigError
from allreduce_train.run_logger import RunLogger
from allreduce_train.trainer import Trainer

from helpers import parse


def test_16_bit_halves_the_bytes_of_both_exchanges():
    numel = 61_706  # LeNet-5
    full = compression.allreduce_bytes_per_step(numel, 4, "none")
    assert full == 2 * 3 / 4 * numel * 4
    assert (
        compression.allreduce_bytes_per_step(numel, 4, "fp16")
        == compression.allreduce_bytes_per_step(numel, 4, "bf16")
        == full / 2
    )
    assert compression.allreduce_bytes_per_step(numel, 1, "none") == 0
    assert compression.ps_bytes_per_step(numel, "bf16") == (2 * numel, 2 * numel)


@pytest.mark.parametrize("name, dtype", [("none", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_ps_message_carries_its_payload_in_the_wire_dtype_in_the_raw_bytes_mpi_sends(name, dtype):
    raw, head, data = message(5, compression.wire_dtype(name))
    assert data.dtype == dtype and raw.nbytes == HEADER_BYTES + 5 * wirecost.element_bytes(name)
    data.copy_(torch.tensor([0.1, 1.0, 2.0, 3.0, -1e-3]))  # a cast: 0.1 is not exact in 16 bits
    head[0] = 7
    back = torch.from_numpy(raw[HEADER_BYTES:].copy()).view(dtype).float()
    assert torch.equal(back, data.float()) and raw[:HEADER_BYTES].view("float64")[0] == 7
    assert (back[0].item() == torch.tensor(0.1).item()) == (name == "none")


@pytest.mark.parametrize("name", wirecost.WIRE_DTYPES)
def test_one_table_gives_each_wire_format_its_dtype_and_torchs_element_size(name):
    # --compression's choices, the 16-bit names, the wire dtype and the bytes a bucket counts, all from wirecost
    dtype = make_wire(name).dtype
    assert dtype == compression.wire_dtype(name) and parse(["--compression", name, "--allreduce-engine", "mpi"])
    size = torch.empty((), dtype=dtype).element_size()
    assert wirecost.element_bytes(name) == buffers.element_size(dtype) == size
    assert (name in wirecost.SIXTEEN_BIT) == (size == 2) and (name == "powersgd") == (not make_wire(name).streams)


@pytest.mark.parametrize("flags", [[], ["--average-every", "4"], ["--diloco-every", "4"]])
def test_the_schedule_runs_the_one_wire_format_its_engine_was_given(flags):
    ex = LocalExchange()
    ex.wire = make_wire("fp16")  # as create_exchange gives it (its only maker)
    assert make_schedule(parse(flags).exchange, ex).wire is ex.wire
    assert LocalExchange().wire.dtype == torch.float32  # an engine given none sums float32


def test_bf16_with_horovod_is_refused_naming_the_flag_and_the_way_out():
    with pytest.raises(ConfigError, match=r"--compression bf16.*--allreduce-engine mpi"):
        parse(["--compression", "bf16"])


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_16_bit_with_mpis_own_allreduce_is_refused(wire):
    with pytest.raises(ConfigError, match=f"--compression {wire} with --mpi-algorithm iallreduce"):
        parse(["--allreduce-engine", "mpi", "--compression", wire, "--mpi-algorithm", "iallreduce"])


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--grad-clip", "1"], r"--grad-clip with --reduce-op adasum.*--grad-clip 0"),
        (["--model", "ptb-lstm-small"], r"--grad-clip with --reduce-op adasum"),  # the LSTM's recipe clips at 5
        (["--horovod-backend", "gloo"], r"Adasum over MPI only; use --horovod-backend mpi"),
        (["--strategy", "none"], r"--reduce-op adasum with --strategy none"),
        (["--allreduce-engine", "torch"], r"--reduce-op adasum is Horovod's"),
        (["--compression", "powersgd"], r"--compression powersgd"),
    ],
)
def test_adasum_where_horovod_cannot_run_it_is_refused_naming_the_flag(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse(["--reduce-op", "adasum", *argv])


@pytest.mark.parametrize("argv", [["--optimizer", "adamw"], ["--optimizer", "adam"], ["--no-decay-norm-bias"]])
def test_the_parameter_server_accepts_any_optimizer_and_its_groups(argv):
    # the servers run the optimizer's own class on their shards (distributed/ps/optimizer.py)
    cfg = parse(["--strategy", "ps", *argv])
    assert cfg.exchange.strategy == "ps"


def test_local_sgd_synchronises_the_warm_up_and_each_periods_last_step():
    schedule = LocalSGD(LocalExchange(), WireFormat("none"), 4, 3)
    assert [s for s in range(1, 16) if schedule.synchronous(s)] == [1, 2, 3, 7, 11, 15]
    assert all(LocalSGD(LocalExchange(), WireFormat("none"), 1, 0).synchronous(s) for s in range(1, 9))


def test_local_sgd_sends_a_period_s_gradients_and_parameters_once():
    ring = compression.allreduce_bytes_per_step(1000, 4)
    assert bytes_per_step(1000, 4, 1) == ring  # synchronous SGD: the gradients only
    assert bytes_per_step(1000, 4, 8) == 2 * ring / 8
    assert bytes_per_step(1000, 4, 8, grad_elem=2) == 1.5 * ring / 8  # fp16 gradients, float32 parameters
    assert bytes_per_step(1000, 1, 8) == 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--strategy", "ps", "--average-every", "4"], "--average-every"),
        (["--average-every", "4", "--reduce-op", "adasum"], "--reduce-op"),
        (["--average-warmup-steps", "10"], "--average-every H"),
        (["--average-every", "-1"], "--average-every"),
    ],
)
def test_local_sgd_combinations_that_cannot_work_are_named(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse(argv)


class RecordingExchange(LocalExchange):
    """The single-process exchange, noting what local SGD asks of it."""

    def __init__(self):
        self.exchanging, self.sums = [], []

    def set_exchanging(self, on):
        self.exchanging.append(on)

    def sum_over_workers(self, values):
        self.sums.append(values.numel())
        return values


def test_the_loop_exchanges_on_the_warm_up_and_period_ends_and_averages_every_parameter_there(tmp_path):
    def train(extra, ex):
        cfg = parse(
            [
                "--dataset",
                "synthetic",
                "--synthetic-samples",
                "640",
                "--batch-size",
                "32",
                "--steps",
                "12",
                "--log-every",
                "12",
                "--eval-every",
                "12",
                "--no-progress",
                "--threads",
                "1",
                "--run-dir",
                str(tmp_path),
                *extra,
            ]
        )
        trainer = Trainer(cfg, ex, str(tmp_path / "run"))
        (tmp_path / "run").mkdir(exist_ok=True)
        setup = trainer.build()
        trainer.run(setup, RunLogger(str(tmp_path / "run"), 12, 0, tensorboard=False, progress=False))
        return setup.model

    ex = RecordingExchange()
    local = train(["--average-every", "4", "--average-warmup-steps", "2"], ex)
    assert [s for s, on in enumerate(ex.exchanging, 1) if on] == [1, 2, 6, 10]
    numel = sum(p.numel() for p in local.parameters())
    assert ex.sums.count(numel) == 2  # the parameters, at the ends of the two periods after the warm-up
    # one worker: its own gradient is the average, so local SGD is plain SGD
    plain = train([], RecordingExchange())
    for (name, p), q in zip(local.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
