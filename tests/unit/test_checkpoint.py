import os
import sys

import pytest
import torch

from allreduce_train import checkpoint
from allreduce_train.errors import UserError


def state(v):
    return {"model": {"w": torch.full((3,), float(v))}, "optimizer": {}, "step": v, "config": {}}


def test_roundtrip_and_replace(tmp_path):
    p = str(tmp_path / "c.pt")
    checkpoint.save(p, state(1))
    checkpoint.save(p, state(2))
    assert checkpoint.load(p)["step"] == 2
    assert os.listdir(tmp_path) == ["c.pt"]  # no temporary left behind


def test_failed_write_keeps_previous_good_checkpoint(tmp_path):
    p = str(tmp_path / "c.pt")
    checkpoint.save(p, state(1))

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full, say")

    with pytest.raises(RuntimeError):
        checkpoint.save(p, {**state(2), "bad": Unpicklable()})
    assert checkpoint.load(p)["step"] == 1
    assert os.listdir(tmp_path) == ["c.pt"]


def test_load_rejects_missing_torn_and_foreign_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        checkpoint.load(str(tmp_path / "none.pt"))
    torn = tmp_path / "torn.pt"
    torn.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        checkpoint.load(str(torn))
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(1)}, foreign)
    with pytest.raises(UserError, match="lacks 'model'"):
        checkpoint.load(str(foreign))


def test_weights_only_refuses_code(tmp_path):
    p = tmp_path / "evil.pt"
    torch.save({"model": {}, "optimizer": {}, "step": 0, "config": {}, "x": os.getcwd}, p)
    with pytest.raises(UserError):
        checkpoint.load(str(p))


def test_a_workers_state_round_trips_and_reads_the_keys_checkpoints_had_before_it(tmp_path):
    rng = torch.get_rng_state()
    mine = checkpoint.WorkerState(
        rng,
        {"hidden": torch.ones(2)},
        exchange={"error": [torch.zeros(1)]},
        schedule={"local_sgd": {"params": [torch.ones(3)]}},
    )
    saved = mine.to_dict()
    # on disk the keys every checkpoint had: rng, task, exchange, and the schedule's under its own name
    assert set(saved) == {"rng", "task", "exchange", "local_sgd"}
    checkpoint.save(str(tmp_path / "c.pt"), {**state(1), "workers": [saved]})
    back = checkpoint.WorkerState.from_dict(checkpoint.load(str(tmp_path / "c.pt"))["workers"][0])
    assert torch.equal(back.rng, rng) and torch.equal(back.task["hidden"], torch.ones(2))
    assert torch.equal(back.schedule["local_sgd"]["params"][0], torch.ones(3)) and back.cuda_rng is None
    # written before PowerSGD existed: no "exchange" key
    old = checkpoint.WorkerState.from_dict({"rng": rng, "task": None})
    assert old.exchange is None and old.schedule == {}


def test_a_workers_state_without_rng_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"--resume x\.pt: the checkpoint's per-worker state has no 'rng'"):
        checkpoint.WorkerState.from_dict({"task": None}, "x.pt")


# ------------------------------------------------------------------ export, --init-from, what a run keeps


class Tied(torch.nn.Module):
    """Odd on purpose: tied input and output embeddings, BatchNorm buffers (an int64 counter among them),
    a bias-only layer and a 1x1 matrix."""

    def __init__(self, vocab=5, width=3) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.norm = torch.nn.BatchNorm1d(width)
        self.tiny = torch.nn.Linear(1, 1)
        self.shift = torch.nn.Parameter(torch.zeros(width))  # a bias with no weight
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        h = self.norm(self.embed(x)) + self.shift
        return self.head(h) + self.tiny(h[:, :1])


def trained(seed=0) -> Tied:
    torch.manual_seed(seed)
    m = Tied()
    m(torch.randint(0, 5, (8,))).sum().backward()  # BatchNorm's running statistics move
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    return m


def a_checkpoint(tmp_path, model, step=7):
    run = tmp_path / "run"
    checkpoint.save(str(run / "checkpoint.pt"), {**state(step), "model": model.state_dict()})
    return run


def export_cli(capsys, *argv):
    from allreduce_train.cli import main

    capsys.readouterr()
    code: str | int | None
    try:
        code = main(["export", *map(str, argv)])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_export_writes_a_plain_state_dict_that_torch_loads_strictly_with_tied_weights_kept_tied(tmp_path, capsys):
    model = trained()
    run = a_checkpoint(tmp_path, model)
    code, out, _ = export_cli(capsys, run, "--out", tmp_path / "w.pt")
    assert code == 0 and "step 7" in out
    sd = torch.load(tmp_path / "w.pt", weights_only=True)
    assert list(sd) == list(model.state_dict())  # torch's own names and order, both names of the tied matrix
    assert sd["embed.weight"].data_ptr() == sd["head.weight"].data_ptr()  # one tensor on disk, as in the model
    assert all(t.device.type == "cpu" and t.is_contiguous() for t in sd.values())
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "w.pt").stat().st_mode & 0o777 == 0o666 & ~mask  # as any file written with open()
    fresh = Tied()
    fresh.load_state_dict(sd)  # strict: every name, no other
    assert fresh.head.weight is fresh.embed.weight  # still tied after loading
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    x = torch.randint(0, 5, (6,))
    assert torch.equal(fresh.eval()(x), model.eval()(x))


def test_export_compacts_views_into_larger_storage():
    flat = torch.arange(12.0)
    sd = {"a": flat[:4], "b": flat[4:].view(2, 4).t()}  # a prefix view; a non-contiguous view at an offset
    out = checkpoint.plain_state_dict(sd)
    for k in sd:
        assert torch.equal(out[k], sd[k]) and out[k].is_contiguous()
        assert out[k].untyped_storage().nbytes() == out[k].numel() * 4  # torch.save writes 16 floats, not 12 each


@pytest.mark.parametrize(
    "source, out, needle",
    [
        ("missing.pt", "w.pt", "export {t}/missing.pt: file not found"),
        ("empty-run", "w.pt", f"export {{t}}/empty-run: no {checkpoint.CHECKPOINT_NAME} in this directory"),
        ("notes.pt", "w.pt", "export {t}/notes.pt: not a readable PyTorch file"),
        ("list.pt", "w.pt", "neither a model state_dict"),
        ("run/checkpoint.pt", "nodir/w.pt", "--out {t}/nodir/w.pt: no directory {t}/nodir"),
        ("run/checkpoint.pt", "run/checkpoint.pt", "the checkpoint itself"),
        ("run", "run", "a directory; give a file name"),
    ],
)
def test_export_bad_input_is_one_line_and_exit_2_and_nothing_is_written(tmp_path, capsys, source, out, needle):
    a_checkpoint(tmp_path, trained())
    (tmp_path / "empty-run").mkdir()
    (tmp_path / "notes.pt").write_text("not a torch file\n")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = export_cli(capsys, tmp_path / source, "--out", tmp_path / out)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("allreduce_train: error: "), err
    assert needle.format(t=tmp_path) in lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] == 7  # the source unharmed


def test_export_converts_a_plain_state_dict_too(tmp_path, capsys):
    model = trained()
    torch.save(model.state_dict(), tmp_path / "in.pt")
    code, out, _ = export_cli(capsys, tmp_path / "in.pt", "--out", tmp_path / "out.pt")
    assert code == 0 and "step" not in out
    Tied().load_state_dict(torch.load(tmp_path / "out.pt", weights_only=True))


def test_safetensors_export_writes_tied_weights_under_both_names_and_init_from_reads_it(tmp_path, capsys):
    st = pytest.importorskip("safetensors.torch")
    model = trained()
    run = a_checkpoint(tmp_path, model)
    code, _, err = export_cli(capsys, run, "--out", tmp_path / "w.safetensors")
    assert code == 0, err
    sd = st.load_file(str(tmp_path / "w.safetensors"))
    fresh = Tied()
    fresh.load_state_dict(sd)  # strict, as a user of safetensors loads it
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.embed.weight, model.embed.weight)
    # written by a tool that drops a tied duplicate (safetensors' save_model): --init-from fills the twin
    st.save_model(model, str(tmp_path / "deduped.safetensors"))
    other = Tied()
    checkpoint.init_weights(other, str(tmp_path / "deduped.safetensors"))
    assert torch.equal(other.head.weight, model.embed.weight)


def test_safetensors_without_the_package_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    run = a_checkpoint(tmp_path, trained())
    code, _, err = export_cli(capsys, run, "--out", tmp_path / "w.safetensors")
    assert code == 2 and "needs the safetensors package (pip install safetensors)" in err
    assert not (tmp_path / "w.safetensors").exists()


@pytest.mark.parametrize("kind", ["export", "checkpoint"])
def test_init_weights_loads_every_parameter_and_buffer(tmp_path, capsys, kind):
    model = trained()
    run = a_checkpoint(tmp_path, model, step=11)
    path = run / "checkpoint.pt"
    if kind == "export":
        assert export_cli(capsys, run, "--out", tmp_path / "w.pt")[0] == 0
        path = tmp_path / "w.pt"
    fresh = Tied()
    assert checkpoint.init_weights(fresh, str(path)) == (11 if kind == "checkpoint" else None)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k  # BatchNorm's running statistics and counter too
    assert fresh.head.weight is fresh.embed.weight


def test_init_weights_of_another_model_names_what_differs_in_one_line(tmp_path):
    torch.save(Tied(vocab=7).state_dict(), tmp_path / "shapes.pt")
    torch.save(torch.nn.Linear(3, 2).state_dict(), tmp_path / "names.pt")
    with pytest.raises(UserError) as e:
        checkpoint.init_weights(Tied(), str(tmp_path / "shapes.pt"))
    msg = str(e.value)
    assert msg.startswith(f"--init-from {tmp_path}/shapes.pt: not this model's weights: ") and "\n" not in msg
    assert "2 of another shape (embed.weight 7x3 in the file, 5x3 here, head.weight 7x3 in the file, 5x3 here)" in msg
    with pytest.raises(UserError) as e:
        checkpoint.init_weights(Tied(), str(tmp_path / "names.pt"))
    msg = str(e.value)
    assert "10 missing (shift, embed.weight, norm.weight and 7 more)" in msg
    assert "2 not in this model (weight, bias)" in msg
    model = Tied()
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError):
        checkpoint.init_weights(model, str(tmp_path / "names.pt"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snapshot.items())  # refused before loading


def test_init_weights_refuses_missing_and_foreign_files_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^--init-from \S+/none\.pt: file not found"):
        checkpoint.init_weights(Tied(), str(tmp_path / "none.pt"))
    p = tmp_path / "evil.pt"
    torch.save({"w": os.getcwd}, p)  # code, not tensors: weights_only refuses it
    with pytest.raises(UserError, match=r"not a readable PyTorch file") as e:
        checkpoint.init_weights(Tied(), str(p))
    assert "\n" not in str(e.value)


def test_keep_checkpoints_leaves_the_latest_and_the_last_n_step_files(tmp_path):
    kept = checkpoint.Kept(str(tmp_path), keep=2, target="")
    for step in (4, 8, 12, 16):
        kept.write(state(step), latest=True, best=False)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-000012.pt", "step-000016.pt"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "checkpoints"]  # no temporary left, no best
    latest = checkpoint.load(str(tmp_path / "checkpoint.pt"))
    assert latest["step"] == 16
    # the latest is the newest step file (one file, two names); the next write replaces only the name
    assert os.path.samefile(tmp_path / "checkpoint.pt", tmp_path / "checkpoints" / "step-000016.pt")
    kept.write(state(20), latest=True, best=False)
    assert checkpoint.load(str(tmp_path / "checkpoints" / "step-000016.pt"))["step"] == 16
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-000016.pt", "step-000020.pt"]


def test_keep_checkpoints_keeps_later_step_files_of_a_run_resumed_from_before_them(tmp_path):
    kept = checkpoint.Kept(str(tmp_path), keep=1, target="")
    for step in (10, 20, 30):
        kept.write(state(step), latest=True, best=False)
    kept.write(state(15), latest=True, best=False)  # resumed from an older checkpoint
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-000015.pt", "step-000030.pt"]


def test_keep_checkpoints_without_hard_links_writes_the_latest_in_full(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    kept = checkpoint.Kept(str(tmp_path), keep=1, target="")
    kept.write(state(3), latest=True, best=False)
    assert checkpoint.load(str(tmp_path / "checkpoint.pt"))["step"] == 3
    assert not os.path.samefile(tmp_path / "checkpoint.pt", tmp_path / "checkpoints" / "step-000003.pt")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "checkpoints"]


@pytest.mark.parametrize(
    "target, values, best_step",
    [("eval/loss<=0", [3.0, 2.0, 2.5, 2.0, 1.5], 5), ("eval/accuracy>=1.1", [0.3, 0.5, 0.4, 0.5], 2)],
)
def test_the_best_follows_the_targets_direction_and_a_tie_keeps_the_earlier(tmp_path, target, values, best_step):
    kept = checkpoint.Kept(str(tmp_path), keep=0, target=target)
    metric = target.split("<")[0].split(">")[0]
    for step, v in enumerate(values, 1):
        if kept.record(step, {metric: v, "eval/other": -v}):
            kept.write(state(step), latest=False, best=True)
    best = checkpoint.load(str(tmp_path / checkpoint.BEST_NAME))
    assert best["step"] == best_step and best["best"]["step"] == best_step
    assert best["best"]["value"] == values[best_step - 1]
    assert not kept.record(9, {metric: float("nan")})
    assert os.listdir(tmp_path) == [checkpoint.BEST_NAME]  # the latest was not asked for


def test_the_best_so_far_comes_back_from_the_checkpoint_or_the_best_file_whichever_is_better(tmp_path):
    kept = checkpoint.Kept(str(tmp_path), keep=0, target="eval/loss<=0")
    kept.record(5, {"eval/loss": 2.0})
    kept.write(state(5), latest=True, best=True)
    kept.record(8, {"eval/loss": 1.0})
    kept.write(state(8), latest=False, best=True)  # better, after the latest checkpoint
    again = checkpoint.Kept(str(tmp_path), keep=0, target="eval/loss<=0")
    again.load_state_dict(checkpoint.load(str(tmp_path / "checkpoint.pt")))
    assert again.best == {"metric": "eval/loss", "op": "<=", "value": 1.0, "step": 8}
    assert not again.record(9, {"eval/loss": 1.5})
    other = checkpoint.Kept(str(tmp_path), keep=0, target="eval/accuracy>=0.9")  # another metric: forgotten
    other.load_state_dict(checkpoint.load(str(tmp_path / "checkpoint.pt")))
    assert other.best is None


@pytest.mark.heavy
def test_a_hugging_face_gpt2_exports_to_both_formats_and_its_own_safetensors_file_starts_a_run(tmp_path, capsys):
    """A model from a widely used library, with tied input and output embeddings: our export loads strictly into
    a fresh GPT2LMHeadModel (.pt and .safetensors) and gives the same logits; the file transformers itself writes
    (save_pretrained, which drops the tied lm_head.weight) is accepted by --init-from."""
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    run = a_checkpoint(tmp_path, model)
    x = torch.randint(0, 50, (2, 5))
    for out, load in (("w.pt", lambda p: torch.load(p, weights_only=True)), ("w.safetensors", st.load_file)):
        assert export_cli(capsys, run, "--out", tmp_path / out)[0] == 0
        fresh = transformers.GPT2LMHeadModel(config).eval()
        fresh.load_state_dict(load(str(tmp_path / out)))
        assert fresh.lm_head.weight is fresh.transformer.wte.weight
        assert torch.equal(fresh(x).logits, model(x).logits), out
    model.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    assert "lm_head.weight" not in st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    fresh = transformers.GPT2LMHeadModel(config).eval()
    checkpoint.init_weights(fresh, str(tmp_path / "hf" / "model.safetensors"))
    assert torch.equal(fresh(x).logits, model(x).logits)


def sharded_step(kept, step, best=False):
    """What a sharded run of 2 workers writes at ``step``: each worker's shard file (a (2, 3) parameter cut
    after its 4th element, a (4,) one whole on worker 1), then the manifest naming them; the whole state."""
    whole = {
        0: {"step": torch.tensor(float(step)), "exp_avg": torch.arange(6.0).view(2, 3) + step},
        1: {"step": torch.tensor(float(step)), "exp_avg": torch.arange(4.0) - step},
    }

    def seg(i, lo, hi, shape):
        flat = whole[i]["exp_avg"].reshape(-1)[lo:hi]
        return {"lo": lo, "hi": hi, "shape": shape, "flat": ["exp_avg"], "state": {**whole[i], "exp_avg": flat}}

    shards = [checkpoint.shard_file(step, r, 2) for r in range(2)]
    pieces = [{0: [seg(0, 0, 4, [2, 3])]}, {0: [seg(0, 4, 6, [2, 3])], 1: [seg(1, 0, 4, [4])]}]
    for r, name in enumerate(shards):
        checkpoint.save(os.path.join(kept.run_dir, name), {"workers": 2, "rank": r, "pieces": pieces[r]})
    manifest = {**state(step), "optimizer": {"state": {}, "param_groups": [{"params": [0, 1]}], "shards": shards}}
    kept.write(manifest, latest=True, best=best)
    kept.prune_shards(step, shards)
    return whole


def test_a_sharded_checkpoint_joins_its_shard_files_and_only_unnamed_ones_are_removed(tmp_path):
    kept = checkpoint.Kept(str(tmp_path), keep=1, target="eval/loss<=0")
    best = sharded_step(kept, 3, best=True)
    sharded_step(kept, 6)
    whole = sharded_step(kept, 9)
    # step 3's files stay (checkpoint-best.pt names them), step 6's go (no kept checkpoint names them)
    assert sorted(os.listdir(tmp_path / "shards")) == [f"step-00000{s}.{r}-of-2.pt" for s in (3, 9) for r in (0, 1)]
    for path, expected, step in (
        ("checkpoint.pt", whole, 9),
        ("checkpoints/step-000009.pt", whole, 9),  # its shards from the run directory above it
        ("checkpoint-best.pt", best, 3),
    ):
        got = checkpoint.load(str(tmp_path / path))
        assert got["step"] == step and "shards" not in got["optimizer"]
        assert got["optimizer"]["state"].keys() == expected.keys()
        for i, st in expected.items():
            assert all(torch.equal(got["optimizer"]["state"][i][k], v) for k, v in st.items())
    os.unlink(tmp_path / "shards" / "step-000009.1-of-2.pt")
    with pytest.raises(UserError, match=r"^--resume .*checkpoint.pt: its optimizer state is in shards/step-000009"):
        checkpoint.load(str(tmp_path / "checkpoint.pt"))
