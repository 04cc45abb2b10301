"""The cost model's sharded concept (lab/common/costmodel.py ``Method(shard=S)``, wirecost's
``sharded_bytes_per_step``): stages 1-2 move the ring's bytes as a reduce-scatter and an all-gather,
stage 3 1.5x of them, with a latency per gathered module; the combinations the trainer refuses are
refused here too."""

import math

import pytest
import torch
from torch import nn

from allreduce_train.distributed import wirecost
from lab.common import costmodel as cm
from lab.common import gradients

MODELS = ("lenet5", "ptb-lstm-small", "resnet18")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("n", [2, 3, 8, 64])
@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2_move_the_rings_bytes_in_as_many_messages(model, n, stage):
    shapes = gradients.shapes(model)
    ring = cm.method_cost(cm.BASELINE, cm.ALLREDUCE, n, shapes)
    zero = cm.method_cost(cm.Method(shard=stage), cm.ALLREDUCE, n, shapes)
    numel = sum(math.prod(s) for s in shapes)
    assert zero.volume == pytest.approx(ring.volume)
    assert zero.volume == pytest.approx(2 * (n - 1) / n * 4 * numel)  # 2(N-1)/N of the model per rank
    assert zero.messages == ring.messages == 2 * (n - 1)
    assert zero.extra_compute_s == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("n", [2, 4, 64])
def test_stage_3_moves_one_and_a_half_rings_with_a_latency_per_gathered_module(model, n):
    shapes, m = gradients.shapes(model), gradients.modules(model)
    ring = cm.method_cost(cm.BASELINE, cm.ALLREDUCE, n, shapes)
    zero3 = cm.method_cost(cm.Method(shard=3), cm.ALLREDUCE, n, shapes, modules=m)
    assert zero3.volume == pytest.approx(1.5 * ring.volume)
    # one reduce-scatter of the gradients, each module's all-gather for forward and again for backward
    assert zero3.messages == (n - 1) * (2 * m + 1)
    # without the module count every tensor is taken as its own module: the most latency a model can have
    most = cm.method_cost(cm.Method(shard=3), cm.ALLREDUCE, n, shapes)
    assert most.messages == (n - 1) * (2 * len(shapes) + 1) >= zero3.messages


def test_owning_modules_counts_the_holders_of_parameters_once():
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied: gathered with the embedding, not again with the head
    bias_only = nn.Module()
    bias_only.bias = nn.Parameter(torch.zeros(3))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    net = nn.Sequential(emb, nn.ReLU(), head, nn.BatchNorm1d(10), bias_only, frozen)
    assert gradients.owning_modules(net) == 3  # emb, BatchNorm (weight, bias), the bias-only module
    assert gradients.modules("lenet5") == 5  # two convolutions, three linear layers


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("sixteen", ["fp16", "bf16"])
def test_16_bits_narrow_the_gradients_reduce_scatter_only(stage, sixteen):
    numel, n = 1_000_000, 4
    full = wirecost.sharded_bytes_per_step(numel, n, stage)
    half = wirecost.sharded_bytes_per_step(numel, n, stage, sixteen)
    gathers = 2 if stage == 3 else 1
    scatter = (n - 1) / n * numel  # elements of one reduce-scatter (or one all-gather) per rank
    assert full - half == pytest.approx(scatter * 2)  # the gradients at 2 bytes instead of 4
    assert half == pytest.approx(scatter * (2 + 4 * gathers))  # the parameters stay float32
    m = cm.Method.parse(f"zero{stage}+{sixteen}")
    assert m.label == f"zero{stage}+{sixteen}" and m == cm.Method(sixteen, shard=stage)
    cost = cm.method_cost(m, cm.ALLREDUCE, n, 4.0 * numel)
    assert cost.volume == pytest.approx(half)
    assert cost.extra_compute_s == pytest.approx(2 * cm.CAST_BYTES * numel / cm.HOST.mem_bw)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_one_worker_sends_nothing(stage):
    cost = cm.method_cost(cm.Method(shard=stage), cm.ALLREDUCE, 1, gradients.shapes("lenet5"))
    assert (cost.messages, cost.volume, cost.extra_compute_s) == (0, 0, 0)
    assert wirecost.sharded_bytes_per_step(1000, 1, stage) == 0


def test_stage_3_predicts_a_slower_step_than_the_ring_and_stage_2_the_same():
    shapes, m, net = gradients.shapes("resnet18"), gradients.modules("resnet18"), cm.Network(50e-6, 10e9 / 8)
    ring, two, three = (
        cm.predict_method(cm.Method(shard=s), cm.ALLREDUCE, 8, shapes, 0.1, 32, net, modules=m) for s in (0, 2, 3)
    )
    assert two.step_s == pytest.approx(ring.step_s)
    assert three.step_s > ring.step_s and three.volume == pytest.approx(1.5 * ring.volume)
    assert (ring.method, two.method, three.method) == ("fp32", "zero2", "zero3")


@pytest.mark.parametrize(
    "text, match",
    [
        ("zero4", "zero1, zero2 or zero3"),
        ("zero", "zero1, zero2 or zero3"),
        ("zero2+powersgd-r4", "fp16 or bf16 only"),
        ("zero2+fp32", "fp16 or bf16 only"),
        ("localsgd-h4+zero2", "refuses local SGD"),
    ],
)
def test_what_the_trainer_refuses_with_sharded_is_refused(text, match):
    with pytest.raises(ValueError, match=match):
        cm.Method.parse(text)


def test_refused_combinations_and_exchanges():
    for kwargs in ({"compression": cm.POWERSGD}, {"every": 4}, {"outer": 16}):
        with pytest.raises(ValueError):
            cm.Method(shard=2, **kwargs)
    with pytest.raises(ValueError, match="shard stage"):
        cm.Method(shard=4)
    with pytest.raises(ValueError, match="allreduce engines"):
        cm.method_cost(cm.Method(shard=1), cm.PS_COLOCATED, 4, 1e6)
    with pytest.raises(ValueError, match="1, 2 or 3"):
        wirecost.sharded_bytes_per_step(1000, 4, 0)
