"""The communication-reduction concepts' pieces that need no second rank (docs/concepts.md)."""

import pytest
import torch

from allreduce_train.distributed import compression
from allreduce_train.distributed.horovod import HorovodAllreduce
from allreduce_train.distributed.ps.exchange import HEADER_BYTES, _message
from allreduce_train.distributed.ring import check_config as ring_check
from allreduce_train.errors import ConfigError

from helpers import parse


def test_16_bit_halves_the_bytes_of_both_exchanges():
    numel = 61_706  # LeNet-5
    full = compression.allreduce_bytes_per_step(numel, 4, "none")
    assert full == 2 * 3 / 4 * numel * 4
    assert compression.allreduce_bytes_per_step(numel, 4, "fp16") == compression.allreduce_bytes_per_step(
        numel, 4, "bf16") == full / 2
    assert compression.allreduce_bytes_per_step(numel, 1, "none") == 0
    assert compression.ps_bytes_per_step(numel, "bf16") == (2 * numel, 2 * numel)


@pytest.mark.parametrize("name, dtype", [("none", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_ps_message_carries_its_payload_in_the_wire_dtype_in_the_raw_bytes_mpi_sends(name, dtype):
    raw, head, data = _message(5, compression.wire_dtype(name))
    assert data.dtype == dtype and raw.nbytes == HEADER_BYTES + 5 * compression.bytes_per_element(name)
    data.copy_(torch.tensor([0.1, 1.0, 2.0, 3.0, -1e-3]))  # a cast: 0.1 is not exact in 16 bits
    head[0] = 7
    back = torch.from_numpy(raw[HEADER_BYTES:].copy()).view(dtype).float()
    assert torch.equal(back, data.float()) and raw[:HEADER_BYTES].view("float64")[0] == 7
    assert (back[0].item() == torch.tensor(0.1).item()) == (name == "none")


def test_bf16_with_horovod_is_refused_naming_the_flag_and_the_way_out():
    with pytest.raises(ConfigError, match="--compression bf16.*--allreduce-engine mpi"):
        HorovodAllreduce(parse(["--compression", "bf16"]).exchange)


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_16_bit_with_mpis_own_allreduce_is_refused(wire):
    with pytest.raises(ConfigError, match=f"--compression {wire} with --mpi-algorithm iallreduce"):
        ring_check(parse(["--allreduce-engine", "mpi", "--compression", wire, "--mpi-algorithm", "iallreduce"]))
