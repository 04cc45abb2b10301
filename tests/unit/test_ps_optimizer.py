"""The parameter server's handling of the user's optimizer that needs no second rank: what a worker
checks before sending it, and the servers' per-segment state joined back per parameter."""

from typing import Any

import pytest
import torch

from allreduce_train.distributed.bucketing import plan
from allreduce_train.distributed.ps.optimizer import describe
from allreduce_train.distributed.shardstate import assemble
from allreduce_train.errors import UserError


class Needy(torch.optim.SGD):
    def __init__(self, params, lr, special):
        super().__init__(params, lr=lr)


def test_what_the_main_worker_sends_of_adamw_with_two_groups_and_a_parameter_outside_them():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2, bias=False))
    params: list[torch.Tensor] = list(model.parameters())  # 0.weight, 0.bias, 1.weight, 1.bias, 2.weight
    groups: list[dict[str, Any]] = [{"params": [params[0], params[4]]}, {"params": params[1:3], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups)
    params[0].grad, params[4].grad = torch.ones_like(params[0]), torch.ones_like(params[4])
    params[1].grad = params[2].grad = None
    opt.step()  # state for the two with a gradient
    sent = describe(opt, params)
    assert sent["cls"] is torch.optim.AdamW
    assert sent["group_of"] == [0, 1, 1, None, 0]  # 1.bias is in no group: the servers leave it as it is
    assert [g["weight_decay"] for g in sent["groups"]] == [0.01, 0.0] and "params" not in sent["groups"][0]
    assert sent["state"].keys() == {0, 4} and torch.equal(sent["state"][4]["exp_avg"], opt.state[params[4]]["exp_avg"])


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda ps: Needy(ps, lr=0.1, special=1), r"Needy\(param_groups\)\), which failed: .*special"),
        (lambda ps: type("Local", (torch.optim.SGD,), {})(ps, lr=0.1), "cannot be imported by name"),
        (lambda ps: torch.optim.SGD([*ps, torch.zeros(2, requires_grad=True)], lr=0.1), "not one of the model's"),
    ],
    ids=["constructor-needs-more", "unnamed-class", "foreign-tensor"],
)
def test_an_optimizer_the_servers_cannot_build_is_refused_naming_the_fix(make, needle):
    params: list[torch.Tensor] = list(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(UserError, match=needle):
        describe(make(params), params)


def test_the_servers_slices_join_into_each_parameters_state_in_its_shape():
    """A 3x4 matrix split in chunks of at most 4 elements over 2 servers and a 3-element vector kept
    whole: the per-element tensors are joined in the parameter's shape, ``step`` taken once."""
    params = [torch.zeros(3, 4), torch.zeros(3)]
    layout = plan([12, 3], 2, split_elems=4, bucket_elems=100)
    assert any(hi - lo < 12 for (b, s), segs in layout.segments.items() for p, lo, hi in segs if p == 0)
    moments = [torch.arange(12.0).view(3, 4), torch.tensor([-1.0, -2.0, -3.0])]
    masters = [torch.arange(100.0, 112.0), torch.tensor([7.0, 8.0, 9.0])]
    answers: list[dict] = [{} for _ in range(2)]
    for (b, s), segs in layout.segments.items():
        flat, states = [], []
        for p, lo, hi in segs:
            flat.append(masters[p][lo:hi])
            whole = hi - lo == params[p].numel()
            piece = moments[p] if whole else moments[p].reshape(-1)[lo:hi]
            states.append({"exp_avg": piece.clone(), "step": torch.tensor(5.0)})
        answers[s][b] = (torch.cat(flat), states)
    state, master = assemble(layout, params, answers)
    for p in range(2):
        assert torch.equal(state[p]["exp_avg"], moments[p]) and state[p]["exp_avg"].shape == params[p].shape
        assert float(state[p]["step"]) == 5.0 and state[p]["step"].dim() == 0
        assert torch.equal(master[p], masters[p])
