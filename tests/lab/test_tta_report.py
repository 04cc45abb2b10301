"""time_to_accuracy.png: what the figure draws from a grid's results (no jobs run here)."""

import struct

from allreduce_train.config import parse_target
from lab.tta.report import markdown, metric_key, plot_time_to_accuracy


def job(model, method, n, evals, target, ok=True, reached=None):
    key = metric_key(target)
    rec = {"model": model, "method": method, "workers": n, "repeat": 1, "ok": ok, "hosts": "this machine",
           "target": target, "evals": [{"step": 10 * (i + 1), "seconds": 2.0 * (i + 1), key: v}
                                       for i, v in enumerate(evals)] if ok else [],
           "error": None if ok else "exit 1", "log": "logs/x.log", "steps": 10 * len(evals),
           "samples_per_sec": 100.0, "loadavg_before": 0.5, "final": {key: evals[-1]} if evals else {},
           "reached": bool(reached)}
    if reached:
        rec.update(steps_to_target=10 * reached, seconds_to_target=2.0 * reached, epochs_to_target=0.5 * reached)
    return rec


def png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_one_panel_per_model_and_worker_count_with_every_job_that_evaluated(tmp_path):
    acc, ppl = "eval/accuracy>=0.8", "eval/perplexity<=300"
    jobs = [job("lenet5", "ring-horovod", 1, [0.5, 0.7, 0.85], acc, reached=3),
            job("lenet5", "ps-sync-colocated", 1, [0.5, 0.6, 0.7], acc),  # not reached: a line, no star
            job("lenet5", "ring-mpi", 2, [0.6, 0.82], acc, reached=2),
            job("lenet5", "ps-async-colocated", 2, [], acc, ok=False),  # failed: no line
            job("ptb-lstm-small", "ring-horovod", 1, [900.0, 400.0, 280.0], ppl, reached=3)]
    res = {"targets": {"lenet5": acc, "ptb-lstm-small": ppl}, "jobs": jobs}
    path = tmp_path / "tta.png"
    drawn = plot_time_to_accuracy(str(path), res)
    # rows: models; columns: N = 1, 2; the LSTM has no job at N = 2, so that panel says "no data"
    assert drawn == [[("ring-horovod", 1), ("ps-sync-colocated", 1)], [("ring-mpi", 2)],
                     [("ring-horovod", 1)], []]
    assert png_size(path) == (840, 680)  # 4.2 x 3.4 inches per panel at 100 dpi


def test_the_report_shows_the_figure():
    acc = "eval/accuracy>=0.8"
    res = {"started": "t", "minutes": 1.0, "command": ["python"], "out_dir": "out", "notes": [],
           "machine": {"cores": 2, "platform": "linux"}, "targets": {"lenet5": acc}, "what": {"lenet5": "test"},
           "config": {"seed": 1, "evals_per_epoch": 4, "emulate_from": 0, "link_rate": "1gbit"},
           "jobs": [job("lenet5", "ring-horovod", 1, [0.5, 0.85], acc, reached=2)]}
    assert "](time_to_accuracy.png)" in markdown(res)


def test_the_plot_reads_targets_as_the_trainer_does():
    assert (metric_key("eval/accuracy>=0.89"), parse_target("eval/accuracy>=0.89")[1:]) == ("eval_accuracy", (">=", 0.89))
    assert (metric_key("eval/perplexity<=300"), parse_target("eval/perplexity<=300")[1:]) == (
        "eval_perplexity", ("<=", 300.0))
