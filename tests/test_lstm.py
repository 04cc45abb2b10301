"""The LSTM language models and the communication-heavy CNN: sizes, truncated BPTT, and training
across real ranks."""

import json

import pytest
import torch

from allreduce_train import ptb
from models import MODELS, count_parameters, get_model

from conftest import check, launch, load_params, rel_diff, run_single
from test_ptb import write_corpus


def lstm_lm_params(vocab: int, hidden: int, layers: int = 2) -> int:
    """Embedding + per layer 4 gates x (input + recurrent weights + 2 biases) + softmax."""
    return vocab * hidden + layers * 4 * hidden * (2 * hidden + 2) + hidden * vocab + vocab


def test_parameter_counts_match_the_published_configurations():
    assert count_parameters(get_model("ptb-lstm-small")) == lstm_lm_params(10_000, 200) == 4_653_200  # "4.6 M"
    assert count_parameters(get_model("ptb-lstm-medium")) == lstm_lm_params(10_000, 650) == 19_780_400  # "20 M"
    assert 10e6 < count_parameters(get_model("resnet18")) == 11_172_810 < 25e6  # the CIFAR-style ResNet-18, 10 classes
    assert (MODELS["ptb-lstm-small"].bptt, MODELS["ptb-lstm-medium"].bptt) == (20, 35)
    # Zaremba: batch 20, lr 1 and clip 5 on the loss summed over the unrolled steps = lr 20, clip 0.25 on the mean
    small = MODELS["ptb-lstm-small"].defaults
    assert (small["batch_size"], small["lr"], small["grad_clip"]) == (20, 20.0, 0.25)


def test_vocabulary_follows_the_data():
    m = MODELS["ptb-lstm-small"].build(vocab_size=57)
    logits, _ = m(torch.zeros(3, 20, dtype=torch.long))
    assert logits.shape == (3, 20, 57)


def test_truncated_bptt_carries_the_state_but_not_the_graph():
    from allreduce_train.config import Config, DataConfig, ModelConfig
    from allreduce_train.tasks import LanguageModelTask

    cfg = Config(model=ModelConfig("ptb-lstm-small"), data=DataConfig(dataset="synthetic"))
    task = LanguageModelTask(cfg, MODELS["ptb-lstm-small"])
    torch.manual_seed(0)
    model = MODELS["ptb-lstm-small"].build(vocab_size=50)
    x = torch.randint(0, 50, (4, 20))
    rows = slice(0, 4)
    first = task.loss(model, x, x, rows)
    h1 = task.hidden[0]
    assert not h1[0].requires_grad and h1[0].abs().sum() > 0
    second = task.loss(model, x, x, rows)  # same window, carried state: a different loss
    assert second.item() != pytest.approx(first.item(), abs=1e-6)
    second.backward()  # would fail ("backward through the graph a second time") without detach
    first.backward()
    task.start_epoch()
    assert task.loss(model, x, x, rows).item() == pytest.approx(first.item(), rel=1e-6)  # fresh state


def test_evaluation_scores_every_token_once_carrying_the_state():
    import torch.nn.functional as F

    from allreduce_train.config import Config, DataConfig, ModelConfig
    from allreduce_train.tasks import LanguageModelTask

    task = LanguageModelTask(Config(model=ModelConfig("ptb-lstm-small"), data=DataConfig(dataset="synthetic")),
                             MODELS["ptb-lstm-small"])
    torch.manual_seed(0)
    model = MODELS["ptb-lstm-small"].build(vocab_size=40).eval()
    stream = torch.randint(0, 40, (203,))
    part = ptb.eval_part(stream, 0, 1)
    with torch.no_grad():
        whole, _ = model(part.inputs[None])  # one pass over the whole text: what windows with carried state equal
        expected = F.cross_entropy(whole[0], part.targets, reduction="sum").item()
        one = task.eval_sums(model, part, "cpu", 1)
        assert one[1] == 202 and one[0].item() == pytest.approx(expected, rel=1e-5)
        for rows in (3, 7, 500):  # parallel streams and a ragged tail: still every token exactly once
            assert task.eval_sums(model, part, "cpu", rows)[1] == 202


def test_dropout_masks_are_the_models_own():
    m = MODELS["ptb-lstm-medium"].build(vocab_size=30)
    x = torch.randint(0, 30, (2, 35))
    a, _ = m(x)
    b, _ = m(x)
    assert not torch.equal(a, b)  # dropout 0.5 is on in training mode
    m.eval()
    assert torch.equal(m(x)[0], m(x)[0])


def test_the_model_brings_its_recipe_unless_told_otherwise(tmp_path):
    from test_config import parse

    cfg = parse(["--model", "ptb-lstm-small"])
    assert (cfg.data.dataset, cfg.data.batch_size, cfg.optim.lr, cfg.optim.momentum, cfg.optim.grad_clip,
            cfg.optim.scale_lr, cfg.data.data_dir) == ("ptb", 20, 20.0, 0.0, 0.25, False, "")
    cfg = parse(["--model", "ptb-lstm-small", "--lr", "0.5", "--dataset", "synthetic", "--scale-lr"])
    assert (cfg.optim.lr, cfg.data.dataset, cfg.optim.scale_lr, cfg.data.batch_size) == (0.5, "synthetic", True, 20)
    f = tmp_path / "run.toml"
    f.write_text('[model]\nmodel = "ptb-lstm-medium"\n[optim]\ngrad-clip = 1\n')
    cfg = parse(["--config", str(f)])
    assert (cfg.optim.grad_clip, cfg.optim.lr) == (1.0, 35.0)
    plain = parse(["--model", "resnet18"])  # no recipe: the common defaults
    assert (plain.optim.lr, plain.data.dataset, plain.data.data_dir) == (0.01, "fashion-mnist", parse([]).data.data_dir)


# ---------------------------------------------------------------- real ranks

# lr 1 rather than the recipe's 20: gentler steps keep rounding differences from growing; a clip
# below the gradient norm on this corpus (about 0.12 at the start) so that clipping takes part
LM = ["--model", "ptb-lstm-small", "--no-progress", "--log-every", "5", "--warmup-steps", "0", "--no-scale-lr",
      "--lr", "1", "--grad-clip", "0.05"]


@pytest.mark.mpi
def test_two_ranks_equal_one_process_on_the_same_token_streams(tmp_path):
    corpus = str(write_corpus(tmp_path / "corpus", lines=(400, 30, 30)))
    args = LM + ["--data-dir", corpus, "--steps", "15", "--eval-every", "15", "--run-dir", str(tmp_path)]

    def dump(name):
        return ["--name", name, "--dump-params", str(tmp_path / f"{name}-{{rank}}.pt")]

    check(launch(2, args + ["--batch-size", "4"] + dump("np2")))
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
    check(launch(3, args + ["--strategy", "ps", "--batch-size", "4", "--name", "ps",
                            "--dump-params", str(tmp_path / "ps-{rank}.pt")], oversubscribe=True))
    check(run_single(args + ["--batch-size", "8", "--name", "one", "--dump-params", str(tmp_path / "one-{rank}.pt")]))
    single = load_params(tmp_path / "one-0.pt")
    workers = sorted(tmp_path.glob("ps-*.pt"))
    assert len(workers) == 2
    for w in workers:
        assert rel_diff(load_params(w), single) <= 1e-5, w.name


@pytest.mark.mpi
def test_validation_perplexity_falls_on_the_offline_corpus(tmp_path):
    """The default corpus (built into an empty cache here), 2 ranks, the paper's small LSTM."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = check(launch(2, ["--model", "ptb-lstm-small", "--steps", "40", "--eval-every", "10", "--log-every", "10",
                            "--no-progress", "--run-dir", str(tmp_path), "--name", "lm"], timeout=600,
                        env={"XDG_CACHE_HOME": str(tmp_path / "cache")}))
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
