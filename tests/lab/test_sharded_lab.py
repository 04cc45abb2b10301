"""The sharded concept in the lab's method lists (lab/common/sharded.py): every tool names a sharded stage
as its ring method on the same engine plus -zeroS, builds the trainer's own flags for it, and offers exactly
the (stage, engine) pairs the trainer accepts; bench's sharded rows and the concept x engine sentences."""

import pytest

from lab.bench import main as bench
from lab.common import costmodel, engines, sharded
from lab.scaling import spec as scaling
from lab.tta import spec as tta

ENGINES = ("horovod", "mpi")


def accepted_pairs(engine_names=ENGINES):
    return {(s, e) for e in engine_names for s in sharded.STAGES if sharded.accepted(s, e)}


def test_the_trainers_refusal_is_its_own_line_and_acceptance_is_none():
    assert sharded.refusal(("--strategy", "allreduce", "--allreduce-engine", "mpi")) is None
    line = sharded.refusal(("--strategy", "ps", "--average-every", "4"))
    assert line is not None and "--average-every" in line and "\n" not in line
    line = sharded.refusal(("--strategy", "nonsense"))
    assert line is not None and "--strategy" in line  # the parser's line, no exit
    assert sharded.flags(2, "mpi") == ("--strategy", "sharded", "--allreduce-engine", "mpi", "--shard-stage", "2")
    # what the trainer refuses with sharded is refused here, whether or not the trainer has the strategy yet
    for refused in (("--average-every", "4"), ("--compression", "powersgd"), ("--reduce-op", "adasum")):
        assert not sharded.accepted(2, "mpi", refused)


def test_time_to_accuracy_offers_the_accepted_stages_as_ring_methods_plus_the_stage():
    table = tta.methods()
    listed = {(m.param, m.name.split("-")[1]) for m in table.values() if m.concept == "sharded"}
    assert listed == accepted_pairs()
    for stage, engine in listed:
        m = table[f"ring-{engine}-zero{stage}"]
        assert m.flags == sharded.flags(stage, engine) and m.servers == 0 and m.synchronous
    groups = tta.method_groups()
    assert set(groups["sharded"]) >= {f"ring-{e}-zero{s}" for s, e in listed}
    assert not any(table[n].concept == "sharded" for n in groups["concepts"])


def test_the_time_to_accuracy_report_prices_a_sharded_method_as_its_stage():
    from lab.tta.report import cost_model_method

    for name, m in tta.methods().items():
        if m.concept == "sharded":
            assert cost_model_method(name) == (costmodel.Method(shard=m.param), costmodel.ALLREDUCE, 1)


def test_scaling_offers_the_accepted_stages_on_each_allreduce_engine():
    table = scaling.variants()
    zero = {n: v for n, v in table.items() if v.strategy == "sharded"}
    on = {"allreduce": "horovod", "allreduce-mpi": "mpi"}
    assert {(v.method.shard, on[n.rsplit("-", 1)[0]]) for n, v in zero.items()} == accepted_pairs()
    for name, v in zero.items():
        base = table[name.rsplit("-", 1)[0]]
        assert name == f"{base.name}-zero{v.method.shard}"
        assert v.flags == (*base.flags, "--shard-stage", str(v.method.shard)) and v.kind == costmodel.ALLREDUCE
        assert not sharded.refusal(("--strategy", v.strategy, *v.flags))


def test_bench_times_the_accepted_stages_at_two_ranks_and_more_with_the_trainers_flags(tmp_path):
    zero = bench.sharded_impls()
    assert {(s, e) for _, s, e in zero.values()} == accepted_pairs((*ENGINES, "torch"))
    spec = bench.BenchSpec(models=["lenet5"])
    for impl, (ring, stage, engine) in zero.items():
        assert impl == f"{ring}-zero{stage}" and impl in bench.default_impls()
        _, args = bench.job_args(impl, "lenet5", spec, str(tmp_path / "r.json"), str(tmp_path), impl)
        assert args[args.index("--strategy") + 1] == "sharded" and "--shard-stage" in args
        assert args[args.index("--allreduce-engine") + 1] == engine
        assert not bench.runs_at(impl, 1) and bench.runs_at(impl, 2)
    assert bench.runs_at("trainer", 1) and bench.runs_at("trainer-ps", 1)


ZERO = {
    "trainer-mpi-zero2": ("trainer-mpi", 2, "mpi"),
    "trainer-mpi-zero3": ("trainer-mpi", 3, "mpi"),
}


def job(impl, tag, sps, wait_ms=None):
    return {"impl": impl, "tag": tag, "samples_per_sec": sps, "comm_wait_ms": wait_ms}


def test_bench_pairs_each_stage_with_its_ring_round_by_round_and_prices_stage_3():
    spec = bench.BenchSpec(models=["lenet5"], batch_size=64)
    impls = ["trainer-mpi", *ZERO]
    # round 0: the machine slow for everyone; the ratio of the same round is what counts
    mine = [job("trainer-mpi", "r0", 1000.0, 32.0), job("trainer-mpi-zero2", "r0", 990.0)]
    mine += [job("trainer-mpi-zero3", "r0", 800.0), job("trainer-mpi", "r1", 2000.0, 16.0)]
    mine += [job("trainer-mpi-zero2", "r1", 1900.0), job("trainer-mpi-zero3", "r1", 1500.0)]
    pairs = bench.sharded_pairs(mine, spec, impls, "lenet5", 2, ZERO)
    two, three = pairs["trainer-mpi-zero2"], pairs["trainer-mpi-zero3"]
    assert (two["min"], two["max"]) == (pytest.approx(0.95), pytest.approx(0.99))
    assert two["median"] == pytest.approx(0.97) and "model" not in two
    assert three["bytes_over_ring"] == pytest.approx(1.5)
    # the ring's step at 2 ranks of 64: 128 / 1000 = 0.128 s with a 32 ms wait; 1.5x the bytes: + 16 ms
    assert three["model"] == pytest.approx(statistics_median([0.128 / 0.144, 0.064 / 0.072]))
    text = bench.sharded_lines([{"model": "lenet5", "np": 2, "sharded": pairs}])
    assert "trainer-mpi-zero2 / trainer-mpi = 0.970 (0.950-0.990), within 5 % of the ring" in text
    assert "the cost model's 1.5x of the ring's bytes on the ring's measured exchange wait predicts 0.889" in text
    # no ring in the round: nothing paired, nothing said
    assert bench.sharded_pairs(mine[1:3], spec, impls, "lenet5", 2, ZERO) == {}


def statistics_median(v):
    import statistics

    return statistics.median(v)


def test_the_concept_x_engine_split_sets_stages_1_and_2_against_the_ring_and_the_colocated_ps():
    speed = {"trainer-mpi": 100.0, "trainer-ps": 80.0, "trainer-mpi-zero2": 96.0, "trainer-mpi-zero3": 75.0}
    text = "\n".join(engines.markdown("lenet5, 2 ranks", speed, engines.BENCH))
    assert "| sharded, stage 2 | 96 |" in text and "| sharded, stage 3 | 75 |" in text
    assert "Sharded stage 2 / ring, same engine = 0.96 on mpi4py (the ring's bytes)." in text
    assert "Sharded stage 3 / ring, same engine = 0.75 on mpi4py (1.5x the ring's bytes: the parameters" in text
    assert "Sharded / colocated PS, same engine (mpi4py): stage 2 1.20: the same bytes" in text
    assert "stage 3 1." not in text  # stage 3 moves more: not set against the PS
