# allreduce_train: `make train` trains LeNet-5 on Fashion-MNIST across 2 ranks; `make test` tests.
# Every target installs what it needs first (make install is a no-op when nothing changed).

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.install-stamp
NP      ?= 2
ARGS    ?=
INSTALL_INPUTS := pyproject.toml tools/install.sh tools/torch_pip.py tools/build_horovod.sh $(wildcard tools/patches/*.patch)

.PHONY: portability install install-gpu check-gpu-build gpu-check train train-ptb test test-fast test-cluster test-long lint tensorboard tb-check clean help scaling commbench scaling-netns train-ps train-ps-colocated bench bench-tuning slurm-train time-to-accuracy commbench-netns concept-map paper image bench-own bench-precision recommend

help:
	@echo "make install      Debian packages, .venv, torch (CPU; TORCH_VARIANT=cuda), patched Horovod (cached wheel); LAB=0: no Chromium/Slurm"
	@echo "make portability  make install/train/test-fast in a Debian 13 root file system and with CMake 4 (root, network; docs/portability.md)"
	@echo "make install-gpu  .venv-gpu: CUDA torch 2.13.0, NCCL, Horovod with NCCL ops (GBs; docs/gpu.md); CUDA 12 or 13 by the driver, CUDA=12|13 to choose"
	@echo "make check-gpu-build  install-gpu, then check it lists NCCL and trains on CPU without a GPU"
	@echo "make gpu-check    on a one-GPU machine, no network: build Horovod, trainer vs bare Horovod vs DDP table, 2 ranks on the GPU (DRY=1: on CPU)"
	@echo "make train        LeNet-5 on Fashion-MNIST, $(NP) ranks, ring allreduce -> runs/<name>/"
	@echo "make train-ps     the same with a parameter server: 1 dedicated server rank + 2 workers (sync)"
	@echo "make train-ps-colocated  the same with a server shard on each of 2 training ranks (sync)"
	@echo "make train-ptb    Zaremba's small LSTM LM, $(NP) ranks, on the offline corpus (DATA_DIR=<real PTB copy>)"
	@echo "make bench        trainer (Horovod, mpi and torch engines) vs bare Horovod loop vs torch DDP vs PS, LeNet-5/LSTM/ResNet-18, 1 and 2 ranks -> runs/bench-<time>/ (~18 min)"
	@echo "make bench-tuning the trainer's defaults vs one change each (cycle time, waits, allocator, gloo, fp16, ...), 2 ranks (~12 min)"
	@echo "make slurm-train  submit make train's job to Slurm, $(NODES) nodes x 1 rank, and follow it (SLURM_ARGS=\"--time 1:00:00 ...\")"
	@echo "make test         the test suite (unit + real ranks under mpirun)"
	@echo "make test-fast    the tests that need no mpirun (seconds)"
	@echo "make test-cluster the emulated-cluster tests make test leaves out: hosts in network namespaces, Slurm (root; ~10 min)"
	@echo "make test-long    the lab commands end to end make test leaves out: bench, grids, gpu-check, TensorBoard in Chromium (~8 min)"
	@echo "make lint         ruff (lint and format check) and mypy over the tree, as configured in pyproject.toml (seconds)"
	@echo "make tensorboard  serve the latest comparison (scaling, bench) or RUN=<logdir> on http://127.0.0.1:$(PORT)"
	@echo "make tb-check     open a comparison (RUN=<grid dir>, else a small grid it runs) in headless Chromium and check it"
	@echo "make scaling      allreduce vs PS grid, 1 and 2 workers -> runs/scaling/<time>/report.md (~11 min idle, more under load)"
	@echo "make scaling-netns the grid on 1, 2 and 4 emulated hosts at 1gbit and 100mbit (root) -> runs/scaling-netns/<time>/report.md (~12 min)"
	@echo "make paper        the paper's design (Jaeger et al. 2018) on emulated hosts -> runs/paper/<time>/report.md, paper.png (root; ~40 min idle)"
	@echo "make commbench-netns the exchange alone on 2 and 4 emulated hosts at 1gbit and 100mbit vs the cost model (root)"
	@echo "make time-to-accuracy wall time/steps/epochs to test accuracy 0.89 (LeNet-5) and a perplexity (LSTM) per method, 1/2/4 workers (~30 min)"
	@echo "make concept-map  the cost model's map: fastest concept to the quality target (measured steps x predicted step; ARGS=\"--view step\": per step) by model, link, N=4..256 -> runs/concept-map/<time>/ (MEASURED=<scaling-netns results.json>, IMAGES=docs/img)"
	@echo "make bench-precision the trainer at --precision 32 vs bf16-mixed, LeNet-5 and ResNet-18, 2 ranks, alternating rounds"
	@echo "make bench-own    bench with LeNet-5 given as a user model (models.lenet:LeNet5) beside the registered lenet5, same data, same run"
	@echo "make recommend    which concept for your model: MODEL=pkg.mod:fn or TASK=pkg.mod:fn, TARGET='eval/accuracy>=0.9', WORKERS, LINK (root: 2 emulated hosts)"
	@echo "make commbench    gradient exchange alone: Horovod, raw MPI, PS, $(NP) workers -> runs/commbench/<time>/"
	@echo "make image        build deploy/Dockerfile: VARIANT=cpu|gpu, BASE=IMAGE|local (mmdebstrap, no registry), docker/podman/buildah (docs/kubernetes.md)"
	@echo "make clean        remove runs/ and caches (keeps .venv and the Horovod wheel cache)"

install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	bash tools/install.sh
	@touch $@

# Today's toolchains from a clean copy of HEAD: Debian 13 (GCC 14, CMake 3.31, Python 3.13) in a
# chroot, and CMake 4 from PyPI here (docs/portability.md). Not part of make test.
portability:
	bash tools/portability.sh $(ARGS)

# GPU: its own venv, so the CPU install and make test never see it (docs/gpu.md).
install-gpu:
	bash tools/install_gpu.sh $(if $(CUDA),--cuda $(CUDA))

check-gpu-build:
	bash tools/check_gpu_build.sh $(if $(CUDA),--cuda $(CUDA))

# For a machine with one GPU, its own torch, CMake and nvcc, no network, no MPI. DRY=1: CPU, here.
gpu-check:
	bash tools/gpu_check.sh $(if $(DRY),--dry-run) $(ARGS)

train: install
	$(PY) -m launch -np $(NP) -- --model lenet5 --dataset fashion-mnist --epochs 2 $(ARGS)

# The model brings Zaremba's settings (batch 20, lr 20 and clip 0.25 per token; `python -m allreduce_train models`).
# Without DATA_DIR: a PTB-format corpus from Python's own documentation, NOT comparable with PTB.
DATA_DIR ?=
train-ptb: install
	$(PY) -m launch -np $(NP) -- --model ptb-lstm-small --dataset ptb $(if $(DATA_DIR),--data-dir $(DATA_DIR)) \
		--epochs 2 --eval-every 100 $(ARGS)

# 3 ranks on 2 cores: the server sleeps while it waits, so oversubscription costs little.
train-ps: install
	$(PY) -m launch -np 3 --oversubscribe -- --model lenet5 --dataset fashion-mnist --epochs 2 \
		--strategy ps --ps-placement dedicated --ps-servers 1 $(ARGS)

train-ps-colocated: install
	$(PY) -m launch -np 2 -- --model lenet5 --dataset fashion-mnist --epochs 2 \
		--strategy ps --ps-placement colocated $(ARGS)

# On a Slurm login node, or on this machine after `python -m lab.emulation.slurm_cluster up` (docs/clusters.md).
NODES ?= 2
SLURM_ARGS ?=
slurm-train: install
	$(PY) -m launch slurm --nodes $(NODES) --submit $(SLURM_ARGS) -- --model lenet5 --dataset fashion-mnist --epochs 2 $(ARGS)

# Alternating jobs, medians of 4 rounds; ARGS="--models lenet5,resnet18 --repeats 6" for more.
BENCH_MODELS ?= lenet5,ptb-lstm-small,resnet18
bench: install
	$(PY) -m lab bench --models $(BENCH_MODELS) --repeats 3 $(ARGS)

# The tuning table of docs/performance.md: the trainer's defaults against one change each, 2 ranks.
TUNING_MODELS ?= lenet5,ptb-lstm-small
bench-tuning: install
	$(PY) -m lab bench --models $(TUNING_MODELS) --np 2 --repeats 3 \
	    --variant "cycle1=trainer HOROVOD_CYCLE_TIME=1" --variant "cycle3=trainer HOROVOD_CYCLE_TIME=3" \
	    --variant "yield0=trainer OMPI_MCA_mpi_yield_when_idle=0" --variant "hvdwait=trainer ALLREDUCE_TRAIN_WAIT=horovod" \
	    --variant "glibc=trainer ALLREDUCE_TRAIN_MALLOC=glibc" --variant "fusion128mb=trainer HOROVOD_FUSION_THRESHOLD=134217728" \
	    --variant "gloo=trainer --horovod-backend gloo" --variant "fp16=trainer --compression fp16" \
	    --variant "k2=trainer --backward-passes-per-step 2" --variant "ddp+malloc=ddp ALLREDUCE_TRAIN_MALLOC=keep" \
	    --impls trainer,cycle1,cycle3,yield0,hvdwait,glibc,fusion128mb,gloo,fp16,k2,horovod,ddp,ddp+malloc $(ARGS)

scaling: install
	$(PY) -m lab scaling $(ARGS)

scaling-netns: install
	$(PY) -m lab scaling-netns $(ARGS)

commbench-netns: install
	$(PY) -m lab commbench-netns $(ARGS)

# Ring vs PS sync/async to a quality target; 4 workers on emulated hosts (root). TTA_MODELS=lenet5 for one model.
TTA_MODELS ?= lenet5,ptb-lstm-small
time-to-accuracy: install
	$(PY) -m lab time-to-accuracy --models $(TTA_MODELS) $(ARGS)

# Your own model in bench (docs/own_model.md): the registered LeNet-5 (trainer) and the same class given as a user
# model (own), paired in every round on the same data, beside bare Horovod and the bound: the extension point's
# cost per step (docs/performance.md). `python -m lab bench --model PKG.MOD:FN` times your own.
# docs/performance.md's compute-precision table: the trainer at --precision 32 and bf16-mixed, alternating rounds.
PRECISION_MODELS ?= lenet5,resnet18
bench-precision: install
	$(PY) -m lab bench --models $(PRECISION_MODELS) --np 2 --repeats 3 --impls trainer,bf16 \
	    --variant "bf16=trainer --precision bf16-mixed" $(ARGS)

bench-own: install
	$(PY) -m lab bench --models lenet5 --dataset fashion-mnist --impls trainer,own,horovod,bound \
	    --variant "own=trainer --model models.lenet:LeNet5" --repeats 3 $(ARGS)

# Which concept reaches a target fastest for your model (docs/own_model.md); minutes (root: emulated hosts).
WORKERS ?= 8,64,512
LINK ?= 10gbit,100gbit
recommend: install
	$(PY) -m lab recommend $(if $(MODEL),--model $(MODEL)) $(if $(TASK),--task $(TASK)) --target '$(TARGET)' \
	    --workers $(WORKERS) --link $(LINK) $(ARGS)

# Which concept wins where, per the cost model (docs/concepts.md); seconds; to the quality target by default. MEASURED=<scaling-netns results.json>
# marks the emulated cluster's points; IMAGES=docs/img also writes the docs' figure.
MEASURED ?=
concept-map: install
	$(PY) -m lab concept-map $(if $(MEASURED),--measured $(MEASURED)) $(if $(IMAGES),--copy-to $(IMAGES)/concept_map.png) $(ARGS)

# Jäger et al. 2018 re-examined (docs/paper.md): the scaling-netns and time-to-accuracy grids in the paper's design.
paper: install
	$(PY) -m lab paper $(ARGS)

commbench: install
	$(PY) -m lab commbench --np $(NP) --models lenet5,ptb-lstm-small,resnet18 $(ARGS)

# Three tiers, all run by .ci/run (docs/layout.md): make test for every change (under 20 min on 2 cores),
# test-cluster for the emulated clusters (root: network namespaces, Slurm), test-long for the lab's commands end to end.
test: install
	$(PY) -m pytest -q --durations=25 -m "not long and not cluster" tests $(ARGS)

test-cluster: install
	$(PY) -m pytest -q --durations=25 -m "cluster and not long" tests $(ARGS)

test-long: install
	$(PY) -m pytest -q --durations=25 -m long tests $(ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not mpi and not slurm" tests $(ARGS)

# The checks every commit passes before the tests (.ci/run): rules in pyproject's [tool.ruff] and [tool.mypy].
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Port 6006 is refused: to hwloc (inside every mpirun) it is X display :6, and a server there hangs mpirun.
RUN  ?=
PORT ?= 6007
tensorboard: install
	$(PY) -m lab.tbcheck.tbview $(RUN) --port $(PORT)

# IMAGES=docs/img also writes the two figures of docs/scaling.md (tensorboard_custom_scalars.png, scaling.png).
IMAGES ?=
tb-check: install
	$(PY) -m lab.tbcheck $(RUN) $(if $(IMAGES),--images $(IMAGES)) $(ARGS)

# The Kubernetes image (docs/kubernetes.md): docker or podman where its service answers, else buildah
# (chroot isolation, vfs storage); BASE=local: the Debian base from mmdebstrap. Not part of make test
# (minutes); tests/launch/test_image.py checks its plan (DRY=1: print the commands, run none).
VARIANT ?= cpu
image:
	bash tools/image.sh --variant $(VARIANT) $(if $(BASE),--base $(BASE)) $(if $(TAG),--tag $(TAG)) \
		$(if $(ENGINE),--engine $(ENGINE)) $(if $(CUDA),--cuda $(CUDA)) $(if $(DRY),--dry-run)

clean:
	rm -rf runs .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
