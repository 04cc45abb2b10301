import argparse

import pytest

from allreduce_train.config import Config, add_arguments
from allreduce_train.errors import ConfigError

from helpers import parse


def test_defaults_are_valid_and_flags_map_to_fields():
    cfg = parse([])
    assert cfg == Config()
    cfg = parse(["--batch-size", "32", "--lr", "0.05", "--no-scale-lr", "--compression", "fp16", "--steps", "7"])
    assert (cfg.data.batch_size, cfg.optim.lr, cfg.optim.scale_lr, cfg.exchange.compression, cfg.train.steps) == (
        32, 0.05, False, "fp16", 7)


@pytest.mark.parametrize("argv, flag", [
    (["--lr", "-0.1"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--batch-size", "0"], "--batch-size"),
    (["--momentum", "1.5"], "--momentum"),
    (["--epochs", "0"], "--epochs"),
    (["--model", "resnet9000"], "--model"),
    (["--backward-passes-per-step", "0"], "--backward-passes-per-step"),
    (["--name", "a/b"], "--name"),
])
def test_invalid_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as e:
        parse(argv)
    assert str(e.value).startswith(flag)


def test_toml_file_and_cli_priority(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[optim]\nlr = 1\nmomentum = 0.5\n[data]\nbatch-size = 16\n')
    cfg = parse(["--config", str(f), "--momentum", "0.8"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.data.batch_size == 16
    assert cfg.optim.momentum == 0.8  # the command line wins over the file


@pytest.mark.parametrize("text, needle", [
    ("[optim]\nlr = -1\n", "--lr"),
    ("[optimizer]\nlr = 1\n", "[optimizer]"),
    ("[optim]\nlearning_rate = 1\n", "learning_rate"),
    ("[data]\nbatch_size = 'big'\n", "--batch-size"),
    ("[optim\n", "not valid TOML"),
])
def test_bad_toml(tmp_path, text, needle):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f)])
    assert needle in str(e.value)


def test_missing_toml_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        parse(["--config", str(tmp_path / "nope.toml")])


def test_every_field_has_a_flag_and_help():
    p = argparse.ArgumentParser()
    add_arguments(p)
    dests = {a.dest for a in p._actions}
    for section, d in Config().to_dict().items():
        for key in d:
            assert f"{section}.{key}" in dests
    assert all(a.help for a in p._actions if "." in a.dest)
