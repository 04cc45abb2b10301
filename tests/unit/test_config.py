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
        32,
        0.05,
        False,
        "fp16",
        7,
    )


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--lr", "-0.1"], "--lr"),
        (["--lr", "0"], "--lr"),
        (["--batch-size", "0"], "--batch-size"),
        (["--momentum", "1.5"], "--momentum"),
        (["--epochs", "0"], "--epochs"),
        (["--model", "resnet9000"], "--model"),
        (["--backward-passes-per-step", "0"], "--backward-passes-per-step"),
        (["--name", "a/b"], "--name"),
        (["--keep-checkpoints", "-1"], "--keep-checkpoints"),
        (["--keep-best"], "--keep-best"),  # without --target: no metric to keep the best by
        (["--init-from", "w.pt", "--resume", "run/checkpoint.pt"], "--init-from"),
    ],
)
def test_invalid_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as e:
        parse(argv)
    assert str(e.value).startswith(flag)


def test_toml_file_and_cli_priority(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[optim]\nlr = 1\nmomentum = 0.5\n[data]\nbatch-size = 16\n")
    cfg = parse(["--config", str(f), "--momentum", "0.8"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.data.batch_size == 16
    assert cfg.optim.momentum == 0.8  # the command line wins over the file


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[optim]\nlr = -1\n", "--lr"),
        ("[optimizer]\nlr = 1\n", "[optimizer]"),
        ("[optim]\nlearning_rate = 1\n", "learning_rate"),
        ("[data]\nbatch_size = 'big'\n", "--batch-size"),
        ("[optim\n", "not valid TOML"),
    ],
)
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


def test_each_engine_has_its_own_section_and_the_flags_keep_their_names():
    cfg = parse(
        [
            "--horovod-backend",
            "gloo",
            "--mpi-algorithm",
            "iallreduce",
            "--mpi-bucket-bytes",
            "4096",
            "--ps-placement",
            "colocated",
            "--ps-servers",
            "3",
            "--ps-mode",
            "async",
            "--ps-bucket-bytes",
            "8",
            "--ps-split-bytes",
            "16",
        ]
    )
    assert cfg.horovod.backend == "gloo"
    assert (cfg.mpi.algorithm, cfg.mpi.bucket_bytes) == ("iallreduce", 4096)
    assert (cfg.ps.placement, cfg.ps.servers, cfg.ps.mode, cfg.ps.bucket_bytes, cfg.ps.split_bytes) == (
        "colocated",
        3,
        "async",
        8,
        16,
    )
    assert not any(f.startswith(("ps_", "mpi_", "horovod_")) for f in Config().to_dict()["exchange"])


def test_engine_sections_in_a_toml_file_and_their_errors_name_the_flag(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[ps]\nservers = 2\nsplit-bytes = 64\n[mpi]\nbucket_bytes = 128\n[horovod]\nbackend = "gloo"\n')
    cfg = parse(["--config", str(f), "--ps-split-bytes", "32"])
    assert (cfg.ps.servers, cfg.ps.split_bytes, cfg.mpi.bucket_bytes, cfg.horovod.backend) == (2, 32, 128, "gloo")
    for text, needle in [
        ("[ps]\nservers = -1\n", "--ps-servers must be >= 0"),
        ('[mpi]\nalgorithm = "tree"\n', "--mpi-algorithm: unknown value 'tree'"),
        ('[ps]\nbucket_bytes = "big"\n', "--ps-bucket-bytes must be of type int"),
    ]:
        f.write_text(text)
        with pytest.raises(ConfigError, match=needle):
            parse(["--config", str(f)])


@pytest.mark.parametrize(
    "old, table, new",
    [
        ("ps_servers = 2", "ps", "servers"),
        ("ps-mode = 'async'", "ps", "mode"),
        ("mpi_bucket_bytes = 64", "mpi", "bucket_bytes"),
        ("horovod_backend = 'gloo'", "horovod", "backend"),
    ],
)
def test_an_engine_setting_left_in_exchange_says_in_one_line_where_it_went(tmp_path, old, table, new):
    f = tmp_path / "old.toml"
    f.write_text(f"[exchange]\n{old}\n")
    with pytest.raises(ConfigError) as e:
        parse(["--config", str(f)])
    msg = str(e.value)
    assert "\n" not in msg and f"write {new} = ... in [{table}]" in msg and "is unchanged" in msg


def test_a_checkpoints_config_from_before_the_engine_sections_still_resumes(tmp_path):
    """A checkpoint records cfg.to_dict(); resuming reads only model.model and data.batch_size from it,
    so one written when the engines' settings sat in [exchange] loads into today's trainer."""
    import torch

    from allreduce_train import checkpoint
    from allreduce_train.distributed.local import LocalExchange
    from allreduce_train.trainer import Trainer

    cfg = parse(
        [
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "64",
            "--batch-size",
            "8",
            "--steps",
            "2",
            "--no-tensorboard",
            "--no-progress",
            "--device",
            "cpu",
            "--run-dir",
            str(tmp_path),
        ]
    )
    setup = Trainer(cfg, LocalExchange(), str(tmp_path / "fresh")).build()
    old = cfg.to_dict()
    for section in ("horovod", "mpi", "ps"):
        del old[section]
    old["exchange"].update(ps_servers=0, ps_placement="dedicated", mpi_bucket_bytes=1 << 20, horovod_backend="mpi")
    path = tmp_path / "old.pt"
    checkpoint.save(
        str(path),
        {
            "model": setup.model.state_dict(),
            "optimizer": setup.optimizer.state_dict(),
            "step": 1,
            "config": old,
            "workers": None,
        },
    )
    resumed = parse(
        [
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "64",
            "--batch-size",
            "8",
            "--steps",
            "2",
            "--no-tensorboard",
            "--no-progress",
            "--device",
            "cpu",
            "--resume",
            str(path),
        ]
    )
    again = Trainer(resumed, LocalExchange(), str(tmp_path / "resumed")).build()
    assert again.start_step == 1
    assert all(
        torch.equal(a, b)
        for a, b in zip(again.model.state_dict().values(), setup.model.state_dict().values(), strict=True)
    )
