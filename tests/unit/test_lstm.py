"""The LSTM language models and the communication-heavy CNN in one process: sizes, truncated BPTT,
evaluation, the model's recipe."""

import pytest
import torch

from allreduce_train.data import ptb
from models import MODELS, count_parameters, get_model

from helpers import parse


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
    first = task.loss(model, x, x)
    h1 = task.hidden[0]
    assert not h1[0].requires_grad and h1[0].abs().sum() > 0
    second = task.loss(model, x, x)  # same window, carried state: a different loss
    assert second.item() != pytest.approx(first.item(), abs=1e-6)
    second.backward()  # would fail ("backward through the graph a second time") without detach
    first.backward()
    task.start_epoch(0)
    assert task.loss(model, x, x).item() == pytest.approx(first.item(), rel=1e-6)  # fresh state


def test_micro_batches_carry_their_own_rows_state():
    """--backward-passes-per-step 2: the trainer hands the two halves of a batch in order, window after window;
    each half continues its own rows' state, so the mean of the halves' losses is the whole batch's."""
    from allreduce_train.config import Config, DataConfig, ExchangeConfig, ModelConfig
    from allreduce_train.tasks import LanguageModelTask

    def task(k):
        cfg = Config(
            model=ModelConfig("ptb-lstm-small"),
            data=DataConfig(dataset="synthetic"),
            exchange=ExchangeConfig(backward_passes_per_step=k),
        )
        return LanguageModelTask(cfg, MODELS["ptb-lstm-small"])

    torch.manual_seed(0)
    model = MODELS["ptb-lstm-small"].build(vocab_size=50).eval()  # no dropout: the same numbers both ways
    whole, halves = task(1), task(2)
    with torch.no_grad():
        for _ in range(3):  # windows: from the second on, each half must take its own state
            x = torch.randint(0, 50, (6, 20))
            mean = (halves.loss(model, x[:3], x[:3]) + halves.loss(model, x[3:], x[3:])) / 2
            assert mean.item() == pytest.approx(whole.loss(model, x, x).item(), rel=1e-5)
    assert sorted(halves.hidden) == [0, 3]  # keyed by the first row, as the checkpoint stores it


def test_evaluation_scores_every_token_once_carrying_the_state():
    import torch.nn.functional as F

    from allreduce_train.config import Config, DataConfig, ModelConfig
    from allreduce_train.tasks import LanguageModelTask

    task = LanguageModelTask(
        Config(model=ModelConfig("ptb-lstm-small"), data=DataConfig(dataset="synthetic")), MODELS["ptb-lstm-small"]
    )
    torch.manual_seed(0)
    model = MODELS["ptb-lstm-small"].build(vocab_size=40).eval()
    stream = torch.randint(0, 40, (203,))
    part = ptb.eval_part(stream, 0, 1)
    with torch.no_grad():
        whole, _ = model(part.inputs[None])  # one pass over the whole text: what windows with carried state equal
        expected = F.cross_entropy(whole[0], part.targets, reduction="sum").item()
        one = task.evaluate(model, part, "cpu", 1)  # (loss sum, tokens)
        assert one[1] == 202 and one[0].item() == pytest.approx(expected, rel=1e-5)
        for rows in (3, 7, 500):  # parallel streams and a ragged tail: still every token exactly once
            assert task.evaluate(model, part, "cpu", rows)[1] == 202


def test_dropout_masks_are_the_models_own():
    m = MODELS["ptb-lstm-medium"].build(vocab_size=30)
    x = torch.randint(0, 30, (2, 35))
    a, _ = m(x)
    b, _ = m(x)
    assert not torch.equal(a, b)  # dropout 0.5 is on in training mode
    m.eval()
    assert torch.equal(m(x)[0], m(x)[0])


def test_the_model_brings_its_recipe_unless_told_otherwise(tmp_path):

    cfg = parse(["--model", "ptb-lstm-small"])
    assert (
        cfg.data.dataset,
        cfg.data.batch_size,
        cfg.optim.lr,
        cfg.optim.momentum,
        cfg.optim.grad_clip,
        cfg.optim.scale_lr,
        cfg.data.data_dir,
    ) == ("ptb", 20, 20.0, 0.0, 0.25, False, "")
    cfg = parse(["--model", "ptb-lstm-small", "--lr", "0.5", "--dataset", "synthetic", "--scale-lr"])
    assert (cfg.optim.lr, cfg.data.dataset, cfg.optim.scale_lr, cfg.data.batch_size) == (0.5, "synthetic", True, 20)
    f = tmp_path / "run.toml"
    f.write_text('[model]\nmodel = "ptb-lstm-medium"\n[optim]\ngrad-clip = 1\n')
    cfg = parse(["--config", str(f)])
    assert (cfg.optim.grad_clip, cfg.optim.lr) == (1.0, 35.0)
    plain = parse(["--model", "resnet18"])  # no recipe: the common defaults
    assert (plain.optim.lr, plain.data.dataset, plain.data.data_dir) == (0.01, "fashion-mnist", parse([]).data.data_dir)


# ---------------------------------------------------------------- real ranks
