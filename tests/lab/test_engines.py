"""The concept x engine split that bench and the scaling reports print."""

from lab.common import engines


def test_the_horovod_vs_ps_ratio_splits_into_concept_and_implementation():
    # bench's names: "trainer" is the trainer's default (ring-horovod), "horovod" the bare Horovod loop (no cell)
    lines = engines.markdown(
        "lenet5, 2 ranks", {"trainer": 90.0, "ring-mpi": 120.0, "ps-sync-colocated": 100.0, "horovod": 80.0}
    )
    text = "\n".join(lines)
    assert "| ring allreduce | 90 | 120 |" in text and "| PS colocated | – | 100 |" in text
    assert "ring / colocated PS = 1.20: the concept's" in text
    assert "Horovod / mpi4py = 0.75: the implementation's" in text
    assert "Horovod ring / colocated PS = 0.90 is their product (1.20 x 0.75)" in text


def test_without_the_second_engine_nothing_is_attributed():
    text = engines.verdict(engines.cells({"ring-horovod": 90.0, "ps-sync-colocated": 100.0}))
    assert "0.90" in text and "cannot be told apart" in text
    assert engines.markdown("x", {"ps-sync-dedicated": 0.0}) == []  # failed: no table
    # a concept over a method, an asynchronous PS: no cell of the float32 concept x engine table
    assert engines.cells({"ring-mpi-fp16": 1.0, "ps-async-colocated": 1.0}) == {}


def test_the_netns_report_splits_each_host_count_and_rate():
    from lab.scaling import netns

    def row(strategy, n, step_ms):
        return {
            "rate": "1gbit",
            "model": "lenet5",
            "strategy": strategy,
            "workers": n,
            "servers": 0,
            "repeat": 1,
            "ok": True,
            "step_ms": step_ms,
            "wait_ms": 1.0,
            "compute_ms": 5.0,
            "pred_exchange_ms": 1.0,
            "pred_step_ms": 6.0,
            "model_bytes_per_step": 1e5,
        }

    report = {
        "command": "scaling-netns",
        "cpus": 2,
        "started": "now",
        "minutes": 1.0,
        "hosts": "1,4",
        "repeats": 1,
        "rates": ["1gbit"],
        "rows": [
            row("ring-horovod", 1, 5.0),
            row("ring-horovod", 4, 20.0),
            row("ring-mpi", 4, 10.0),
            row("ps-sync-colocated", 4, 12.5),
        ],
    }
    text = netns.markdown(report)
    assert "lenet5, 4 hosts at 1gbit, concept x engine (steps/s)" in text
    assert "1 hosts at" not in text  # one worker exchanges nothing
    assert "ring / colocated PS = 1.25" in text and "Horovod / mpi4py = 0.50" in text
