# allreduce_train: `make train` trains LeNet-5 on Fashion-MNIST across 2 ranks; `make test` tests.
# Every target installs what it needs first (make install is a no-op when nothing changed).

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.install-stamp
NP      ?= 2
ARGS    ?=
INSTALL_INPUTS := pyproject.toml tools/install.sh tools/torch_pip.py tools/build_horovod.sh $(wildcard tools/patches/*.patch)

.PHONY: portability install install-gpu check-gpu-build gpu-check train train-ptb test test-fast test-cluster test-long lint tensorboard tb-check clean help scaling commbench scaling-netns train-ps train-ps-colocated bench bench-tuning slurm-train time-to-accuracy commbench-netns concept-map paper image bench-own bench-precision bench-memory recommend

# `make help`: every target with a `## text` comment on its line or the line before it; $(VAR) in a text shows
# the variable's value (the variables named on the awk line).
## this list: every target and what it does
help:
	@NP='$(NP)' NODES='$(NODES)' PORT='$(PORT)' awk '/^## /{h=substr($$0,4);next} \
	    match($$0,/^[a-z][a-z0-9-]*:/){t=substr($$0,1,RLENGTH-1);if(match($$0,/ ## /))h=substr($$0,RSTART+4); \
	    while(match(h,/\$$\([A-Z_]+\)/))h=substr(h,1,RSTART-1) ENVIRON[substr(h,RSTART+2,RLENGTH-3)] substr(h,RSTART+RLENGTH); \
	    if(h!="")printf "make %-12s %s\n",t,h} {h=""}' $(firstword $(MAKEFILE_LIST))

## Debian packages, .venv, torch (CPU; TORCH_VARIANT=cuda), patched Horovod (cached wheel); LAB=0: no Chromium/Slurm
install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	bash tools/install.sh
	@touch $@

# Today's toolchains from a clean copy of HEAD: Debian 13 (GCC 14, CMake 3.31, Python 3.13) in a
# chroot, and CMake 4 from PyPI here (docs/portability.md). Not part of make test.
## make install/train/test-fast in a Debian 13 root file system and with CMake 4 (root, network; docs/portability.md)
portability:
	bash tools/portability.sh $(ARGS)

# GPU: its own venv, so the CPU install and make test never see it (docs/gpu.md).
## .venv-gpu: CUDA torch 2.13.0, NCCL, Horovod with NCCL ops (GBs; docs/gpu.md); CUDA 12 or 13 by the driver, CUDA=12|13 to choose
install-gpu:
	bash tools/install_gpu.sh $(if $(CUDA),--cuda $(CUDA))

## install-gpu, then check it lists NCCL and trains on CPU without a GPU
check-gpu-build:
	bash tools/check_gpu_build.sh $(if $(CUDA),--cuda $(CUDA))

# For a machine with one GPU, its own torch, CMake and nvcc, no network, no MPI. DRY=1: CPU, here.
## on a one-GPU machine, no network: build Horovod, trainer vs bare Horovod vs DDP table, 2 ranks on the GPU (DRY=1: on CPU)
gpu-check:
	bash tools/gpu_check.sh $(if $(DRY),--dry-run) $(ARGS)

## LeNet-5 on Fashion-MNIST, $(NP) ranks, ring allreduce -> runs/<name>/
train: install
	$(PY) -m launch -np $(NP) -- --model lenet5 --dataset fashion-mnist --epochs 2 $(ARGS)

# The model brings Zaremba's settings (batch 20, lr 20 and clip 0.25 per token; `python -m allreduce_train models`).
# Without DATA_DIR: a PTB-format corpus from Python's own documentation, NOT comparable with PTB.
DATA_DIR ?=
## Zaremba's small LSTM LM, $(NP) ranks, on the offline corpus (DATA_DIR=<real PTB copy>)
train-ptb: install
	$(PY) -m launch -np $(NP) -- --model ptb-lstm-small --dataset ptb $(if $(DATA_DIR),--data-dir $(DATA_DIR)) \
		--epochs 2 --eval-every 100 $(ARGS)

# 3 ranks on 2 cores: the server sleeps while it waits, so oversubscription costs little.
## the same with a parameter server: 1 dedicated server rank + 2 workers (sync)
train-ps: install
	$(PY) -m launch -np 3 --oversubscribe -- --model lenet5 --dataset fashion-mnist --epochs 2 \
		--strategy ps --ps-placement dedicated --ps-servers 1 $(ARGS)

## the same with a server shard on each of 2 training ranks (sync)
train-ps-colocated: install
	$(PY) -m launch -np 2 -- --model lenet5 --dataset fashion-mnist --epochs 2 \
		--strategy ps --ps-placement colocated $(ARGS)

# On a Slurm login node, or on this machine after `python -m lab.emulation.slurm_cluster up` (docs/clusters.md).
NODES ?= 2
SLURM_ARGS ?=
## submit make train's job to Slurm, $(NODES) nodes x 1 rank, and follow it (SLURM_ARGS="--time 1:00:00 ...")
slurm-train: install
	$(PY) -m launch slurm --nodes $(NODES) --submit $(SLURM_ARGS) -- --model lenet5 --dataset fashion-mnist --epochs 2 $(ARGS)

# Alternating jobs, medians of 4 rounds; ARGS="--models lenet5,resnet18 --repeats 6" for more.
BENCH_MODELS ?= lenet5,ptb-lstm-small,resnet18
## trainer (Horovod, mpi and torch engines) vs bare Horovod loop vs torch DDP vs PS, LeNet-5/LSTM/ResNet-18, 1 and 2 ranks -> runs/bench-<time>/ (~18 min)
bench: install
	$(PY) -m lab bench --models $(BENCH_MODELS) --repeats 3 $(ARGS)

# docs/performance.md "Memory per rank": an MLP (lab/memory/model.py) with AdamW; ARGS="--workers 1,2" for less.
## per-rank memory of the ring, the PS (dedicated, colocated) and sharded stages 1-3 at 1, 2, 4 ranks vs the ZeRO formula; a run that fits only sharded -> runs/bench-memory/<time>/ (~15 min)
bench-memory: install
	$(PY) -m lab bench-memory $(ARGS)

# The tuning table of docs/performance.md: the trainer's defaults against one change each, 2 ranks.
TUNING_MODELS ?= lenet5,ptb-lstm-small
## the trainer's defaults vs one change each (cycle time, waits, allocator, gloo, fp16, ...), 2 ranks (~12 min)
bench-tuning: install
	$(PY) -m lab bench --models $(TUNING_MODELS) --np 2 --repeats 3 \
	    --variant "cycle1=trainer HOROVOD_CYCLE_TIME=1" --variant "cycle3=trainer HOROVOD_CYCLE_TIME=3" \
	    --variant "yield0=trainer OMPI_MCA_mpi_yield_when_idle=0" --variant "hvdwait=trainer ALLREDUCE_TRAIN_WAIT=horovod" \
	    --variant "glibc=trainer ALLREDUCE_TRAIN_MALLOC=glibc" --variant "fusion128mb=trainer HOROVOD_FUSION_THRESHOLD=134217728" \
	    --variant "gloo=trainer --horovod-backend gloo" --variant "fp16=trainer --compression fp16" \
	    --variant "k2=trainer --backward-passes-per-step 2" --variant "ddp+malloc=ddp ALLREDUCE_TRAIN_MALLOC=keep" \
	    --impls trainer,cycle1,cycle3,yield0,hvdwait,glibc,fusion128mb,gloo,fp16,k2,horovod,ddp,ddp+malloc $(ARGS)

## ring (Horovod, mpi) vs PS grid, 1 and 2 workers -> runs/scaling/<time>/report.md (90 jobs, ~18 min idle)
scaling: install
	$(PY) -m lab scaling $(ARGS)

## the grid on 1, 2 and 4 emulated hosts at 1gbit and 100mbit (root) -> runs/scaling-netns/<time>/report.md (~12 min)
scaling-netns: install
	$(PY) -m lab scaling-netns $(ARGS)

## the exchange alone on 2 and 4 emulated hosts at 1gbit and 100mbit vs the cost model (root)
commbench-netns: install
	$(PY) -m lab commbench-netns $(ARGS)

# Ring vs PS sync/async to a quality target; 4 workers on emulated hosts (root). TTA_MODELS=lenet5 for one model.
TTA_MODELS ?= lenet5,ptb-lstm-small
## wall time/steps/epochs to test accuracy 0.89 (LeNet-5) and a perplexity (LSTM) per method, 1/2/4 workers (~30 min)
time-to-accuracy: install
	$(PY) -m lab time-to-accuracy --models $(TTA_MODELS) $(ARGS)

# docs/performance.md's compute-precision table: the trainer at --precision 32 and bf16-mixed, alternating rounds.
PRECISION_MODELS ?= lenet5,resnet18
## the trainer at --precision 32 vs bf16-mixed, LeNet-5 and ResNet-18, 2 ranks, alternating rounds
bench-precision: install
	$(PY) -m lab bench --models $(PRECISION_MODELS) --np 2 --repeats 3 --impls trainer,bf16 \
	    --variant "bf16=trainer --precision bf16-mixed" $(ARGS)

# Your own model in bench (docs/own_model.md): the registered LeNet-5 (trainer) and the same class given as a user
# model (own), paired in every round on the same data, beside bare Horovod and the bound: the extension point's
# cost per step (docs/performance.md). `python -m lab bench --model PKG.MOD:FN` times your own.
## bench with LeNet-5 given as a user model (models.lenet:LeNet5) beside the registered lenet5, same data, same run
bench-own: install
	$(PY) -m lab bench --models lenet5 --dataset fashion-mnist --impls trainer,own,horovod,bound \
	    --variant "own=trainer --model models.lenet:LeNet5" --repeats 3 $(ARGS)

# Which concept reaches a target fastest for your model (docs/own_model.md); minutes (root: emulated hosts).
WORKERS ?= 8,64,512
LINK ?= 10gbit,100gbit
## which concept for your model: MODEL=pkg.mod:fn or TASK=pkg.mod:fn, TARGET='eval/accuracy>=0.9', WORKERS, LINK (root: 2 emulated hosts)
recommend: install
	$(PY) -m lab recommend $(if $(MODEL),--model $(MODEL)) $(if $(TASK),--task $(TASK)) --target '$(TARGET)' \
	    --workers $(WORKERS) --link $(LINK) $(ARGS)

# Which concept wins where, per the cost model (docs/concepts.md); seconds; to the quality target by default. MEASURED=<scaling-netns results.json>
# marks the emulated cluster's points; IMAGES=docs/img also writes the docs' figure.
MEASURED ?=
## the cost model's map: fastest concept to the quality target (measured steps x predicted step; ARGS="--view step": per step) by model, link, N=4..256 -> runs/concept-map/<time>/ (MEASURED=<scaling-netns results.json>, IMAGES=docs/img)
concept-map: install
	$(PY) -m lab concept-map $(if $(MEASURED),--measured $(MEASURED)) $(if $(IMAGES),--copy-to $(IMAGES)/concept_map.png) $(ARGS)

# Jäger et al. 2018 re-examined (docs/paper.md): the scaling-netns and time-to-accuracy grids in the paper's design.
## the paper's design (Jaeger et al. 2018) on emulated hosts -> runs/paper/<time>/report.md, paper.png (root; ~40 min idle)
paper: install
	$(PY) -m lab paper $(ARGS)

## gradient exchange alone: Horovod, raw MPI, PS, $(NP) workers -> runs/commbench/<time>/
commbench: install
	$(PY) -m lab commbench --np $(NP) --models lenet5,ptb-lstm-small,resnet18 $(ARGS)

# Three tiers, all run by .ci/run (docs/layout.md): make test for every change (under 20 min on 2 cores),
# test-cluster for the emulated clusters (root: network namespaces, Slurm), test-long for the lab's commands end to end.
## the test suite (unit + real ranks under mpirun)
test: install
	$(PY) -m pytest -q --durations=25 -m "not long and not cluster" tests $(ARGS)

## the emulated-cluster tests make test leaves out: hosts in network namespaces, Slurm (root; ~10 min)
test-cluster: install
	$(PY) -m pytest -q --durations=25 -m "cluster and not long" tests $(ARGS)

## the lab commands end to end make test leaves out: bench, grids, gpu-check, TensorBoard in Chromium; every accepted combination of flags trains (~13 min)
test-long: install
	$(PY) -m pytest -q --durations=25 -m long tests $(ARGS)

## the in-process tests that take a moment each: no mpirun, no emulated cluster, no long run, no heavy test (seconds)
test-fast: install
	$(PY) -m pytest -q -m "not mpi and not long and not cluster and not slurm and not heavy" tests $(ARGS)

# The checks every commit passes before the tests (.ci/run): rules in pyproject's [tool.ruff] and [tool.mypy].
## ruff (lint and format check) and mypy over the tree, as configured in pyproject.toml (seconds)
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Port 6006 is refused: to hwloc (inside every mpirun) it is X display :6, and a server there hangs mpirun.
RUN  ?=
PORT ?= 6007
## serve the latest comparison (scaling, bench) or RUN=<logdir> on http://127.0.0.1:$(PORT)
tensorboard: install
	$(PY) -m lab.tbcheck.tbview $(RUN) --port $(PORT)

# IMAGES=docs/img also writes the two figures of docs/scaling.md (tensorboard_custom_scalars.png, scaling.png).
IMAGES ?=
## open a comparison (RUN=<grid dir>, else a small grid it runs) in headless Chromium and check it
tb-check: install
	$(PY) -m lab.tbcheck $(RUN) $(if $(IMAGES),--images $(IMAGES)) $(ARGS)

# The Kubernetes image (docs/kubernetes.md): docker or podman where its service answers, else buildah
# (chroot isolation, vfs storage); BASE=local: the Debian base from mmdebstrap. Not part of make test
# (minutes); tests/launch/test_image.py checks its plan (DRY=1: print the commands, run none).
VARIANT ?= cpu
## build deploy/Dockerfile: VARIANT=cpu|gpu, BASE=IMAGE|local (mmdebstrap, no registry), docker/podman/buildah (docs/kubernetes.md)
image:
	bash tools/image.sh --variant $(VARIANT) $(if $(BASE),--base $(BASE)) $(if $(TAG),--tag $(TAG)) \
		$(if $(ENGINE),--engine $(ENGINE)) $(if $(CUDA),--cuda $(CUDA)) $(if $(DRY),--dry-run)

## remove runs/ and caches (keeps .venv and the Horovod wheel cache)
clean:
	rm -rf runs .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
