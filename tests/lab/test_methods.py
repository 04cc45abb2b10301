"""The lab's one registry of methods (lab/common/methods.py): every method is a combination the trainer accepts and
every accepted one of engine x wire x schedule (x placement x stage) is a method, one name for it in every tool,
the older names read as the new; the sharded stages in each tool's lists, bench's sharded rows and the concept x
engine sentences."""

import json
import os

import pytest

from lab.bench import main as bench
from lab.common import costmodel, engines, methods
from lab.scaling import spec as scaling
from lab.tta import spec as tta

ENGINES = ("horovod", "mpi")


def accepted_pairs(engine_names=ENGINES):
    return {(m.stage, e) for e in engine_names for m in methods.sharded_stages(e)}


def flags_of(engine="", wire="none", rank=0, schedule="", period=0, stage=0, placement="", mode="sync"):
    """The trainer's flags of one combination, written out here as a user would type them."""
    if placement:
        servers = ["--ps-servers", "1"] if placement == "dedicated" else []
        out = ["--strategy", "ps", "--ps-placement", placement, *servers, "--ps-mode", mode]
    elif stage:
        return ("--strategy", "sharded", "--allreduce-engine", engine, "--shard-stage", str(stage))
    else:
        out = ["--strategy", "allreduce", "--allreduce-engine", engine]
    if wire != "none":
        out += ["--compression", wire] + (["--powersgd-rank", str(rank)] if rank else [])
    if schedule:
        out += ["--average-every" if schedule == "localsgd" else "--diloco-every", str(period)]
    return tuple(out)


def test_the_trainers_refusal_is_its_own_line_and_acceptance_is_none():
    assert methods.refusal(("--strategy", "allreduce", "--allreduce-engine", "mpi")) is None
    line = methods.refusal(("--strategy", "ps", "--average-every", "4"))
    assert line is not None and "--average-every" in line and "\n" not in line
    unknown = methods.refusal(("--strategy", "nonsense"))
    assert unknown is not None and "--strategy" in unknown  # the parser's line, no exit
    zero2 = methods.get("ring-mpi-zero2").flags
    assert zero2 == ("--strategy", "sharded", "--allreduce-engine", "mpi", "--shard-stage", "2")
    # what the trainer refuses with sharded is refused here
    for refused in (("--average-every", "4"), ("--compression", "powersgd"), ("--reduce-op", "adasum")):
        assert methods.refusal((*zero2, *refused)) is not None


def test_the_registry_is_every_combination_the_trainer_accepts_and_no_other():
    wires = [("none", 0), ("fp16", 0), ("bf16", 0), *(("powersgd", r) for r in methods.POWERSGD_RANKS)]
    schedules = [("", 0), *(("localsgd", h) for h in methods.LOCALSGD_PERIODS)]
    schedules += [("diloco", h) for h in methods.DILOCO_PERIODS]
    combos = [
        dict(engine=e, wire=w, rank=r, schedule=s, period=h)
        for e in methods.ENGINES
        for w, r in wires
        for s, h in schedules
    ]
    combos += [dict(engine=e, stage=s) for e in methods.ENGINES for s in methods.STAGES]
    combos += [dict(placement=p, mode=m, wire=w) for p in methods.PLACEMENTS for m in methods.MODES for w, _ in wires]
    table = methods.registry()

    def pairs(flags):  # the flags as {flag: value}, whatever their order
        return frozenset(zip(flags[::2], flags[1::2], strict=True))

    by_flags = {pairs(m.flags): m for m in table.values()}
    accepted = 0
    for c in combos:
        flags = flags_of(**c)
        m = by_flags.get(pairs(flags))
        if methods.refusal(flags) is None:  # accepted: one method, named by the scheme
            accepted += 1
            assert m is not None, flags
            assert m.engine == c.get("engine", "") and m.wire == c.get("wire", "none") and m.stage == c.get("stage", 0)
            assert m.name.startswith(f"ring-{m.engine}" if m.engine else f"ps-{m.mode}-{m.placement}")
        else:
            assert m is None, (flags, m)
    assert accepted == len(table)
    # what the trainer refuses today, as examples: Horovod has no bf16 sum, PowerSGD is no PS method, DiLoCo sends
    # float32 deltas only
    for refused in ("ring-horovod-bf16", "ps-sync-colocated-powersgd-r4", "ring-mpi-fp16-diloco-h16"):
        assert refused not in table
    assert methods.defaults().name == "ring-horovod"  # the trainer's config: allreduce on Horovod


# The lab's names before the registry, with the flags each tool gave the trainer for them (after --strategy for
# scaling): each reads as one registry method with those flags.
OLD = {
    "ring-mpi": ("--strategy", "allreduce", "--allreduce-engine", "mpi"),
    "trainer-torch": ("--strategy", "allreduce", "--allreduce-engine", "torch"),
    "ps-sync-colocated": ("--strategy", "ps", "--ps-placement", "colocated"),
    "trainer-zero2": ("--strategy", "sharded", "--shard-stage", "2"),
    "ring-mpi-zero3": ("--strategy", "sharded", "--allreduce-engine", "mpi", "--shard-stage", "3"),
    "allreduce": ("--strategy", "allreduce"),
    "allreduce-mpi-fp16": ("--strategy", "allreduce", "--allreduce-engine", "mpi", "--compression", "fp16"),
    "allreduce-localsgd-h4": ("--strategy", "allreduce", "--average-every", "4"),
    "allreduce-mpi-zero1": ("--strategy", "sharded", "--allreduce-engine", "mpi", "--shard-stage", "1"),
    "ps-dedicated": ("--strategy", "ps", "--ps-placement", "dedicated", "--ps-servers", "1"),
    "ps-colocated-fp16": ("--strategy", "ps", "--ps-placement", "colocated", "--compression", "fp16"),
    "mpi-ring": ("--strategy", "allreduce", "--allreduce-engine", "mpi"),
    "horovod-fp16": ("--strategy", "allreduce", "--compression", "fp16"),
}


def test_every_old_name_reads_as_the_method_with_its_old_flags():
    from allreduce_train.config import build_config

    def exchange(flags):
        c = build_config(["--model", "lenet5", *flags])
        return (c.exchange, c.ps.placement, c.ps.mode, c.ps.servers if c.exchange.strategy == "ps" else 0)

    for old, flags in OLD.items():
        m = methods.get(old)  # canonical() inside
        assert exchange(m.flags) == exchange(flags), old
    assert methods.canonical("ring-mpi-fp16") == "ring-mpi-fp16"  # a new name is its own
    assert methods.canonical("horovod") == "horovod" and methods.canonical("bound") == "bound"  # bench's baselines


OLD_RUN = os.path.join(os.path.dirname(__file__), "data", "scaling_netns_old_names.json")


def test_a_result_file_of_the_old_names_reads_under_the_new():
    """The fixture: rows of a scaling-netns results.json written before the registry (``allreduce``,
    ``allreduce-mpi-localsgd-h4``, ``ps-colocated``). Read through :func:`methods.renamed` they carry the new
    names, the trainer's own values (hparams) untouched; concept-map's ``--measured`` reads it so."""
    from lab.conceptmap.main import measured_points

    with open(OLD_RUN) as fh:
        old = json.load(fh)
    new = methods.renamed({**old, "rows": [*old["rows"], {"strategy": "allreduce", "hparams": {"strategy": "ps"}}]})
    assert [r["strategy"] for r in new["rows"]] == [
        "ring-horovod",
        "ring-horovod-fp16",
        "ring-mpi",
        "ring-mpi-localsgd-h4",
        "ps-sync-colocated",
        "ring-horovod",
    ]
    assert new["rows"][-1]["hparams"] == {"strategy": "ps"} and new["strategies"][0] == "ring-horovod"
    points = {p["engine"]: p for p in measured_points(OLD_RUN)}
    assert set(points) == {"ring-horovod", "ring-mpi"}  # one comparison per engine, the PS in neither
    assert points["ring-horovod"]["measured_best"] == "fp16" and points["ring-mpi"]["measured_best"] == "localsgd-h4"
    # commbench's own old row name (bench's "horovod" is the bare Horovod loop: no global mapping)
    assert methods.renamed({"impl": "horovod"}, methods.COMMBENCH_OLD) == {"impl": "ring-horovod"}
    assert methods.renamed({"impl": "mpi-ring"}) == {"impl": "ring-mpi"}


def test_time_to_accuracy_offers_the_accepted_stages_as_ring_methods_plus_the_stage():
    table = tta.methods()
    listed = {(m.param, m.name.split("-")[1]) for m in table.values() if m.concept == "sharded"}
    assert listed == accepted_pairs()
    for stage, engine in listed:
        m = table[f"ring-{engine}-zero{stage}"]
        assert m.flags == flags_of(engine, stage=stage) and m.servers == 0 and m.synchronous
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
    assert {(v.method.shard, n.split("-")[1]) for n, v in zero.items()} == accepted_pairs()
    for name, v in zero.items():
        base = table[name.rsplit("-", 1)[0]]
        assert name == f"{base.name}-zero{v.method.shard}" and v.commbench_impl == base.name
        assert v.flags == (*base.flags, "--shard-stage", str(v.method.shard)) and v.kind == costmodel.ALLREDUCE
        assert not methods.refusal(("--strategy", v.strategy, *v.flags))


def test_bench_times_the_accepted_stages_at_two_ranks_and_more_with_the_trainers_flags(tmp_path):
    zero = bench.sharded_impls()
    assert {(s, e) for _, s, e in zero.values()} == accepted_pairs((*ENGINES, "torch"))
    spec = bench.BenchSpec(models=["lenet5"])
    for impl, (ring, stage, engine) in zero.items():
        assert impl == f"ring-{engine}-zero{stage}" and impl in bench.default_impls()
        assert ring == ("trainer" if engine == "horovod" else f"ring-{engine}")  # the trainer's default engine
        _, args = bench.job_args(impl, "lenet5", spec, str(tmp_path / "r.json"), str(tmp_path), impl)
        assert args[args.index("--strategy") + 1] == "sharded" and "--shard-stage" in args
        assert args[args.index("--allreduce-engine") + 1] == engine
        assert not bench.runs_at(impl, 1) and bench.runs_at(impl, 2)
    assert bench.runs_at("trainer", 1) and bench.runs_at("ps-sync-colocated", 1)


ZERO = {
    "ring-mpi-zero2": ("ring-mpi", 2, "mpi"),
    "ring-mpi-zero3": ("ring-mpi", 3, "mpi"),
}


def job(impl, tag, sps, wait_ms=None):
    return {"impl": impl, "tag": tag, "samples_per_sec": sps, "comm_wait_ms": wait_ms}


def test_bench_pairs_each_stage_with_its_ring_round_by_round_and_prices_stage_3():
    spec = bench.BenchSpec(models=["lenet5"], batch_size=64)
    impls = ["ring-mpi", *ZERO]
    # round 0: the machine slow for everyone; the ratio of the same round is what counts
    mine = [job("ring-mpi", "r0", 1000.0, 32.0), job("ring-mpi-zero2", "r0", 990.0)]
    mine += [job("ring-mpi-zero3", "r0", 800.0), job("ring-mpi", "r1", 2000.0, 16.0)]
    mine += [job("ring-mpi-zero2", "r1", 1900.0), job("ring-mpi-zero3", "r1", 1500.0)]
    pairs = bench.sharded_pairs(mine, spec, impls, "lenet5", 2, ZERO)
    two, three = pairs["ring-mpi-zero2"], pairs["ring-mpi-zero3"]
    assert (two["min"], two["max"]) == (pytest.approx(0.95), pytest.approx(0.99))
    assert two["median"] == pytest.approx(0.97) and "model" not in two
    assert three["bytes_over_ring"] == pytest.approx(1.5)
    # the ring's step at 2 ranks of 64: 128 / 1000 = 0.128 s with a 32 ms wait; 1.5x the bytes: + 16 ms
    assert three["model"] == pytest.approx(statistics_median([0.128 / 0.144, 0.064 / 0.072]))
    text = bench.sharded_lines([{"model": "lenet5", "np": 2, "sharded": pairs}])
    assert "ring-mpi-zero2 / ring-mpi = 0.970 (0.950-0.990), within 5 % of the ring" in text
    assert "the cost model's 1.5x of the ring's bytes on the ring's measured exchange wait predicts 0.889" in text
    # no ring in the round: nothing paired, nothing said
    assert bench.sharded_pairs(mine[1:3], spec, impls, "lenet5", 2, ZERO) == {}


def statistics_median(v):
    import statistics

    return statistics.median(v)


def test_the_concept_x_engine_split_sets_stages_1_and_2_against_the_ring_and_the_colocated_ps():
    speed = {"ring-mpi": 100.0, "ps-sync-colocated": 80.0, "ring-mpi-zero2": 96.0, "ring-mpi-zero3": 75.0}
    text = "\n".join(engines.markdown("lenet5, 2 ranks", speed))
    assert "| sharded, stage 2 | 96 |" in text and "| sharded, stage 3 | 75 |" in text
    assert "Sharded stage 2 / ring, same engine = 0.96 on mpi4py (the ring's bytes)." in text
    assert "Sharded stage 3 / ring, same engine = 0.75 on mpi4py (1.5x the ring's bytes: the parameters" in text
    assert "Sharded / colocated PS, same engine (mpi4py): stage 2 1.20: the same bytes" in text
    assert "stage 3 1." not in text  # stage 3 moves more: not set against the PS
