"""``--strategy none`` in one process: the exchange of a rank that trains alone."""

import pytest
import torch

from allreduce_train.config import ExchangeConfig
from allreduce_train.distributed.local import NoExchange
from allreduce_train.errors import ConfigError


@pytest.mark.parametrize("extra", [{"compression": "fp16"}, {"average_every": 4}])
def test_none_refuses_what_would_exchange_something(extra):
    with pytest.raises(ConfigError, match="--strategy none exchanges nothing"):
        ExchangeConfig(strategy="none", **extra)


def test_outside_mpirun_it_is_one_worker_whose_vote_and_sums_are_its_own(monkeypatch):
    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    ex = NoExchange()
    assert (ex.rank, ex.size, ex.num_workers, ex.is_main) == (0, 1, 1, True)
    ex.start_vote(torch.tensor([0.0, 2.5], dtype=torch.float64))
    assert ex.end_vote().tolist() == [0.0, 2.5]
    assert ex.sum_over_workers(torch.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]
    assert ex.broadcast_object({"a": 1}) == {"a": 1} and ex.allgather_object(3) == [3]
