"""The language models across real ranks: equality with one process, the parameter server, a
falling validation perplexity, and bad data named in one line."""

import json

import pytest
import torch

from allreduce_train.data import ptb

from helpers import LM, LM_STEPS, check, launch, load_params, rel_diff, run_single, write_corpus


@pytest.mark.mpi
def test_two_ranks_equal_one_process_on_the_same_token_streams(lstm_run):
    """tests/mpi/conftest.py's lstm_run against one process with the double batch."""
    tmp_path = lstm_run
    args = LM + LM_STEPS + ["--data-dir", str(lstm_run / "corpus"), "--run-dir", str(tmp_path)]

    def dump(name):
        return ["--name", name, "--dump-params", str(tmp_path / f"{name}-{{rank}}.pt")]

    r0, r1 = load_params(tmp_path / "np2-0.pt"), load_params(tmp_path / "np2-1.pt")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{k} differs between ranks"
    check(run_single(args + ["--batch-size", "8"] + dump("np1")))
    single = load_params(tmp_path / "np1-0.pt")
    assert rel_diff(r0, single) <= 1e-5
    # ... while training moved the parameters far more than that, and a different split of the
    # stream (not the union of the ranks' rows) gives different parameters
    check(run_single(args + ["--batch-size", "8", "--steps", "1"] + dump("short")))
    assert rel_diff(load_params(tmp_path / "short-0.pt"), single) > 1e-3
    check(run_single(args + ["--batch-size", "4"] + dump("half")))
    assert rel_diff(load_params(tmp_path / "half-0.pt"), single) > 1e-4
    m2 = json.loads((tmp_path / "np2" / "metrics.json").read_text())
    m1 = json.loads((tmp_path / "np1" / "metrics.json").read_text())
    assert m2["final"]["train_loss"] == pytest.approx(m1["final"]["train_loss"], rel=1e-5)  # averaged over ranks
    assert m2["global_batch"] == m1["global_batch"] == 8 and m2["words_per_sec"] > 0


@pytest.mark.mpi
def test_parameter_server_trains_the_lstm_like_one_process(tmp_path):
    """The other strategy, same model: 1 dedicated server + 2 workers (sync) equal one process,
    clipping of the averaged gradient included."""
    corpus = str(write_corpus(tmp_path / "corpus", lines=(400, 30, 30)))
    args = LM + ["--data-dir", corpus, "--steps", "10", "--eval-every", "10", "--run-dir", str(tmp_path)]
    check(
        launch(
            3,
            args
            + [
                "--strategy",
                "ps",
                "--batch-size",
                "4",
                "--name",
                "ps",
                "--dump-params",
                str(tmp_path / "ps-{rank}.pt"),
            ],
            oversubscribe=True,
        )
    )
    check(run_single(args + ["--batch-size", "8", "--name", "one", "--dump-params", str(tmp_path / "one-{rank}.pt")]))
    single = load_params(tmp_path / "one-0.pt")
    workers = sorted(tmp_path.glob("ps-*.pt"))
    assert len(workers) == 2
    for w in workers:
        assert rel_diff(load_params(w), single) <= 1e-5, w.name


@pytest.mark.mpi
@pytest.mark.long  # make test under 20 min: the long tier (CI runs it)
def test_validation_perplexity_falls_on_the_offline_corpus(tmp_path):
    """The default corpus (built into an empty cache here), 2 ranks, the paper's small LSTM."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = check(
        launch(
            2,
            [
                "--model",
                "ptb-lstm-small",
                "--steps",
                "40",
                "--eval-every",
                "10",
                "--log-every",
                "10",
                "--no-progress",
                "--run-dir",
                str(tmp_path),
                "--name",
                "lm",
            ],
            timeout=600,
            env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
        )
    )
    acc = EventAccumulator(str(tmp_path / "lm"))
    acc.Reload()
    ppl = [e.value for e in acc.Scalars("eval/perplexity")]
    assert len(ppl) == 4 and ppl[-1] < 0.8 * ppl[0] and ppl == sorted(ppl, reverse=True), (ppl, proc.stdout)
    vocab = len(ptb.load_ptb(ptb.offline_corpus(str(tmp_path / "cache" / "allreduce_train"))).vocab)
    assert ppl[0] < vocab  # already better than uniform over the vocabulary
    assert "perf/words_per_sec" in acc.Tags()["scalars"]
    assert "NOT Penn Treebank, perplexities are not comparable" in proc.stdout  # said where it is read
    m = json.loads((tmp_path / "lm" / "metrics.json").read_text())
    assert m["dataset"] == "ptb" and m["workers"] == 2 and m["global_batch"] == 40
    assert m["final"]["eval_perplexity"] == pytest.approx(ppl[-1], rel=1e-5) and m["words_per_sec"] > 0


@pytest.mark.mpi
def test_lm_bad_data_dir_one_line(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "ptb.test.txt").unlink()
    proc = launch(2, ["--model", "ptb-lstm-small", "--data-dir", str(corpus), "--run-dir", str(tmp_path)], timeout=60)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(ours) == 1 and "ptb.test.txt: file not found" in ours[0], proc.stderr
