"""The step trace (allreduce_train/trace.py): Chrome JSON, nesting, only the steps asked for, and nothing when off."""

import itertools
import json
import time
import tracemalloc

import pytest

from allreduce_train import trace
from allreduce_train.distributed.local import LocalExchange
from allreduce_train.errors import ConfigError
from allreduce_train.run_logger import NullLogger
from allreduce_train.trace import NULL, PHASES, Tracer
from allreduce_train.trainer import Trainer

from helpers import parse


def complete(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def one_step(tr: Tracer, n: int, buckets: int = 2) -> None:
    """A step as the trainer and an engine report it: forward, backward with the buckets leaving, the wait."""
    tr.step(n)
    tr.mark("forward")
    time.sleep(0.001)
    tr.mark("backward")
    for b in range(buckets):
        tr.bucket_start(b)
    tr.mark("wait")
    for b in reversed(range(buckets)):
        tr.bucket_done(b)
        tr.bucket_done(b)  # polled again after it finished: one event all the same
    tr.mark("update")
    with tr.span("clip"):
        time.sleep(0.001)
    tr.mark("")


def test_a_tracer_writes_chrome_json_of_its_steps_only_once_the_last_is_done(tmp_path):
    path = tmp_path / "trace" / "rank3.json"
    tr = Tracer(3, 2, 4, str(path))
    for n in range(6):
        one_step(tr, n)
        assert path.exists() == (n >= 4)  # step 4 began: steps 2 and 3 are written
    doc = json.loads(path.read_text())
    events = complete(doc)
    assert {e["args"]["step"] for e in events} == {2, 3}
    for e in events:
        assert e["pid"] == 3 and e["dur"] >= 0 and isinstance(e["ts"], float) and isinstance(e["tid"], int)
    names = [(e["args"]["step"], e["name"]) for e in events]
    for n in (2, 3):
        for name in ("data", "forward", "backward", "wait", "update", "clip", f"step {n}", "bucket 0", "bucket 1"):
            assert names.count((n, name)) == 1, (n, name)
    # every lane is named, the step's first, then the phases in their order, then the buckets
    lanes = {e["args"]["name"]: e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert [lanes[p] for p in ("step", *PHASES)] == sorted(lanes[p] for p in ("step", *PHASES))
    assert lanes["bucket 0"] > lanes["checkpoint"] and {e["tid"] for e in events if e["cat"] == "bucket"} == {
        lanes["bucket 0"],
        lanes["bucket 1"],
    }
    assert [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"] == ["rank 3"]


def test_phases_lie_inside_their_step_in_order_and_a_span_inside_its_phase(tmp_path):
    tr = Tracer(0, 0, 1)
    one_step(tr, 0, buckets=1)
    tr.close()
    by = {e["name"]: e for e in tr.events}
    step = by["step 0"]

    def inside(e: dict, outer: dict) -> bool:
        return outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1e-3

    order = [by[p] for p in ("data", "forward", "backward", "wait", "update")]
    assert all(inside(e, step) for e in tr.events)
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in itertools.pairwise(order))
    assert inside(by["clip"], by["update"])
    assert by["backward"]["ts"] <= by["bucket 0"]["ts"] <= by["wait"]["ts"] + by["wait"]["dur"]
    assert by["forward"]["dur"] >= 1000 and by["forward"]["tdur"] < by["forward"]["dur"]  # a sleep costs no CPU


def test_a_run_that_ends_inside_the_range_still_writes_its_steps(tmp_path):
    tr = Tracer(0, 1, 100, str(tmp_path / "t.json"))
    for n in range(3):
        one_step(tr, n, buckets=0)
    tr.close()
    events = complete(json.loads((tmp_path / "t.json").read_text()))
    assert sorted({e["args"]["step"] for e in events}) == [1, 2]


def test_the_null_tracer_does_nothing_and_allocates_nothing():
    assert trace.make("", 0, "unused") is NULL and not NULL.active
    assert NULL.span("a") is NULL.span("b")  # one context manager for every span: none made per call

    def steps() -> None:
        for n in range(2000):
            NULL.step(n)
            NULL.mark("forward")
            NULL.bucket_start(n)
            NULL.bucket_done(n)
            with NULL.span("clip"):
                NULL.begin("x")
                NULL.end("x")
        NULL.close()

    steps()  # warm: whatever the first call sets up once
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        steps()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after == before and peak - before < 1024  # nothing kept, nothing per step (a loop's frame at most)


@pytest.mark.parametrize("value", ["5", "a:b", "3:3", "4:2", "-1:2", "1.5:3", "2:"])
def test_trace_steps_refuses_what_is_not_a_to_b(value):
    with pytest.raises(ConfigError, match=r"--trace-steps .*A:B with whole numbers 0 <= A < B"):
        parse([f"--trace-steps={value}"])  # one word: argparse would take -1:2 for a flag


def test_the_trainer_traces_each_phase_of_the_steps_asked_for(tmp_path):
    cfg = parse(
        ["--dataset", "synthetic", "--synthetic-samples", "320", "--batch-size", "32", "--steps", "8", "--threads", "1"]
        + ["--no-progress", "--eval-every", "6", "--checkpoint-every", "6", "--trace-steps", "4:7"]
    )
    trainer = Trainer(cfg, LocalExchange(), str(tmp_path / "run"))
    trainer.run(trainer.build(), NullLogger())
    doc = json.loads((tmp_path / "run" / "trace" / "rank0.json").read_text())
    events = complete(doc)
    assert {e["args"]["step"] for e in events} == {4, 5, 6}
    for n in (4, 5, 6):
        names = [e["name"] for e in events if e["args"]["step"] == n]
        for phase in ("forward", "backward", "wait", "update", f"step {n}"):
            assert names.count(phase) == 1, (n, phase)
        assert names.count("data") == 2  # this step's batch to the device, and the next one gathered
        # the 6th step (5 done before it) evaluates (--eval-every 6) and checkpoints (--checkpoint-every 6)
        assert names.count("evaluation") == names.count("checkpoint") == (n == 5)
    assert not [e for e in events if e["cat"] == "bucket"]  # one process exchanges nothing
