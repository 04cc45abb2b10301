"""The cost model's communication-reduction methods (lab/common/costmodel.py ``Method``, ``method_cost``,
``predict_method``): their bytes per step are the trainer's own formulas for the real models, and the
limits that define them hold (16 bits halve the bytes term, local SGD with H = 1 is synchronous SGD)."""

import math

import pytest

from allreduce_train.distributed import compression, diloco, localsgd, powersgd
from lab.common import costmodel as cm
from lab.common import gradients

MODELS = ("lenet5", "ptb-lstm-small", "resnet18")
NET = cm.Network(alpha=50e-6, bandwidth=100e6 / 8)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("rank", [1, 4])
@pytest.mark.parametrize("n", [2, 4, 64])
def test_powersgd_volume_is_the_trainers_bytes_per_step(model, rank, n):
    import torch

    shapes = gradients.shapes(model)
    cost = cm.method_cost(cm.Method(cm.POWERSGD, rank), cm.ALLREDUCE, n, shapes)
    assert cost.volume == pytest.approx(powersgd.bytes_per_step([torch.Size(s) for s in shapes], rank, n))
    assert cost.volume < cm.method_cost(cm.BASELINE, cm.ALLREDUCE, n, shapes).volume / 10  # it does compress
    assert cost.messages == 2 * 2 * (n - 1)  # two allreduces per step: the Ps (with the rest), the Qs
    assert cost.extra_compute_s > 0


def test_powersgd_on_a_model_with_no_matrix_to_compress_is_one_allreduce_of_every_element():
    shapes = [(32, 8), (32,), (3, 32), (3,)]  # an MLP 8-32-3: at rank 4 no matrix shrinks
    assert not any(cm.compressible(s, 4) for s in shapes)
    cost = cm.method_cost(cm.Method(cm.POWERSGD, 4), cm.ALLREDUCE, 4, shapes)
    assert (cost.messages, cost.volume) == cm.coefficients(cm.ALLREDUCE, 4, 4.0 * sum(math.prod(s) for s in shapes))


@pytest.mark.parametrize("model", MODELS)
def test_compressible_is_the_trainers_rule(model):
    import torch

    for s in gradients.shapes(model):
        for rank in (1, 2, 4, 16):
            assert cm.compressible(s, rank) == powersgd.compressible(torch.Size(s), rank)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", ["fp16", "bf16", "localsgd-h4", "localsgd-h4+fp16", "localsgd-h1"])
def test_ring_volume_is_the_trainers_bytes_per_step(model, name):
    m, numel, n = cm.Method.parse(name), sum(math.prod(s) for s in gradients.shapes(model)), 8
    cost = cm.method_cost(m, cm.ALLREDUCE, n, gradients.shapes(model))
    want = (
        localsgd.bytes_per_step(numel, n, m.period, m.elem)
        if m.period > 1 or "localsgd" in name
        else compression.allreduce_bytes_per_step(numel, n, m.compression)
    )
    assert cost.volume == pytest.approx(want)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("h", [1, 4, 16])
def test_diloco_volume_is_the_trainers_bytes_per_step_and_refused_off_the_ring(model, h):
    m, numel, n = cm.Method.parse(f"diloco-h{h}"), sum(math.prod(s) for s in gradients.shapes(model)), 8
    assert m.label == f"diloco-h{h}" and m == cm.Method.from_flags(diloco_every=h)
    cost = cm.method_cost(m, cm.ALLREDUCE, n, gradients.shapes(model))
    assert cost.volume == pytest.approx(diloco.bytes_per_step(numel, n, h))
    assert cost.extra_compute_s > 0
    with pytest.raises(ValueError, match="DiLoCo averages over an allreduce only"):
        cm.method_cost(m, cm.PS_COLOCATED, n, gradients.shapes(model))
    with pytest.raises(ValueError, match="DiLoCo"):
        cm.Method(cm.FP16, outer=h)


@pytest.mark.parametrize("kind", cm.KINDS)
@pytest.mark.parametrize("sixteen", [cm.FP16, cm.BF16])
def test_16_bit_halves_the_bytes_term_and_adds_casts(kind, sixteen):
    nbytes, n = gradients.nbytes("ptb-lstm-small"), 16
    full = cm.method_cost(cm.BASELINE, kind, n, nbytes, servers=2)
    half = cm.method_cost(cm.Method(sixteen), kind, n, nbytes, servers=2)
    assert half.volume == pytest.approx(full.volume / 2)
    assert half.messages == full.messages
    assert full.extra_compute_s == 0 and half.extra_compute_s > 0
    bw_only = cm.Network(alpha=0.0, bandwidth=NET.bandwidth)
    assert half.exchange_s(bw_only) == pytest.approx(full.exchange_s(bw_only) / 2)
    if kind == cm.PS_DEDICATED:  # the servers widen every worker's push: their casts grow with N
        more = cm.method_cost(cm.Method(sixteen), kind, 4 * n, nbytes, servers=2)
        assert more.server_s > 3 * half.server_s and more.worker_s == half.worker_s
    elif kind == cm.ALLREDUCE:
        assert half.server_s == 0


def test_16_bit_casts_cost_memory_bandwidth():
    nbytes = gradients.nbytes("resnet18")
    slow, fast = cm.Host(mem_bw=1e9), cm.Host(mem_bw=4e9)
    a = cm.method_cost(cm.Method(cm.FP16), cm.ALLREDUCE, 4, nbytes, host=slow).extra_compute_s
    b = cm.method_cost(cm.Method(cm.FP16), cm.ALLREDUCE, 4, nbytes, host=fast).extra_compute_s
    assert a == pytest.approx(4 * b)
    assert a == pytest.approx(2 * cm.CAST_BYTES * nbytes / 4 / 1e9)  # two casts of every element


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("n", [1, 2, 16])
def test_local_sgd_with_h_1_is_synchronous_sgd(model, n):
    shapes = gradients.shapes(model)
    sync = cm.predict(cm.ALLREDUCE, n, gradients.nbytes(model), 0.05, 32, NET)
    for every in (0, 1):
        local = cm.predict_method(cm.Method(every=every), cm.ALLREDUCE, n, shapes, 0.05, 32, NET)
        assert local.step_s == pytest.approx(sync.step_s) and local.speedup == pytest.approx(sync.speedup)
        assert local.method == "fp32"


def test_local_sgd_amortises_gradients_and_parameters_over_the_period():
    nbytes, n = gradients.nbytes("resnet18"), 8
    sync = cm.method_cost(cm.BASELINE, cm.ALLREDUCE, n, nbytes)
    for h in (2, 4, 16):
        local = cm.method_cost(cm.Method(every=h), cm.ALLREDUCE, n, nbytes)
        # a gradient allreduce and a parameter allreduce per period
        assert local.volume == pytest.approx(2 * sync.volume / h)
        assert local.messages == pytest.approx(2 * sync.messages / h)


def test_predict_method_fp32_equals_predict_for_every_exchange():
    nbytes = gradients.nbytes("lenet5")
    for kind in cm.KINDS:
        for n in (1, 4, 256):
            a = cm.predict(kind, n, nbytes, 0.01, 64, NET, servers=2)
            b = cm.predict_method(cm.BASELINE, kind, n, nbytes, 0.01, 64, NET, servers=2)
            assert (a.step_s, a.speedup, a.exchange_s) == pytest.approx((b.step_s, b.speedup, b.exchange_s))


def test_powersgd_wins_on_a_slow_link_and_fp32_on_a_fast_one_for_a_small_model():
    shapes = gradients.shapes("ptb-lstm-small")
    slow = cm.Network(alpha=0.0, bandwidth=10e6 / 8)
    step = {
        m: cm.predict_method(cm.Method.parse(m), cm.ALLREDUCE, 4, shapes, 0.1, 20, slow).step_s
        for m in ("fp32", "fp16", "powersgd-r4")
    }
    assert step["powersgd-r4"] < step["fp16"] < step["fp32"]
    tiny, fast = gradients.shapes("lenet5"), cm.Network(alpha=1e-6, bandwidth=100e9 / 8)
    step = {
        m: cm.predict_method(cm.Method.parse(m), cm.ALLREDUCE, 4, tiny, 0.01, 64, fast).step_s
        for m in ("fp32", "fp16", "powersgd-r4")
    }
    assert min(step, key=step.__getitem__) == "fp32"  # nothing to save: the casts and the products cost more


@pytest.mark.parametrize("text", ["fp32", "fp16", "bf16", "powersgd-r4", "localsgd-h4", "localsgd-h16+fp16"])
def test_method_labels_parse_back(text):
    assert cm.Method.parse(text).label == text


@pytest.mark.parametrize("text", ["fp8", "powersgd", "localsgd-h0", "fp16+localsgd-h4", "localsgd-h4+powersgd-r2"])
def test_bad_methods_are_refused(text):
    with pytest.raises(ValueError):
        cm.Method.parse(text)


def test_method_from_trainer_flags():
    assert cm.Method.from_flags("none", 1, 0) == cm.BASELINE
    assert cm.Method.from_flags("powersgd", 4, 0).label == "powersgd-r4"
    assert cm.Method.from_flags("fp16", 4, 8).label == "localsgd-h8+fp16"


def test_methods_the_trainer_refuses_are_refused_by_the_model():
    shapes = gradients.shapes("lenet5")
    with pytest.raises(ValueError, match="allreduce only"):
        cm.method_cost(cm.Method(cm.POWERSGD, 4), cm.PS_COLOCATED, 4, shapes)
    with pytest.raises(ValueError, match="allreduce only"):
        cm.method_cost(cm.Method(every=4), cm.PS_DEDICATED, 4, shapes)
    with pytest.raises(ValueError, match="shapes"):
        cm.method_cost(cm.Method(cm.POWERSGD, 4), cm.ALLREDUCE, 4, 1e6)
