"""Build and run the ``mpirun`` line for a training job.

    python -m launch -np 2 -- --model lenet5 --epochs 2
    python -m launch -np 8 -H node1:4,node2:4 -- --model lenet5
    python -m launch -np 16 --hostfile hosts.txt -- --config run.toml

The exact command is printed before it runs. Arguments after ``--`` go to
``python -m allreduce_train train`` untouched; the command is an argument list, never a shell
string. Flags follow Horovod's guidance for Open MPI: ``-bind-to none -map-by slot`` (let each
rank's threads use its share of the cores), ``-x`` to forward the environment Horovod and NCCL
read, and ``-mca pml ob1 -mca btl ^openib`` so that multi-host jobs use plain TCP instead of
probing for InfiniBand verbs.

The lab's emulated hosts (``python -m lab.emulation -np 4 --emulate-hosts 4 ...``: network
namespaces on one machine, lab/emulation/) run through this same code: :func:`main` takes them as a
plug-in (``emulation``), and a :class:`LaunchSpec`'s ``cluster`` is any object with the four methods
``build_command`` calls. The launcher never imports the lab.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# EXIT_DIR_ENV: where every rank records its exit code as it exits (allreduce_train/errors.py record_exit)
from .bound import GRACE_PERIOD, exit_dir, run_bounded, why
from .elastic import PROBE_TIMEOUT, Elastic, ElasticError, host_arg, parse_host_list, read_hostfile
from .exitcodes import EXIT_DIR_ENV, EXIT_INTERRUPTED, EXIT_OK, EXIT_STALLED, EXIT_USAGE, NOT_RESTARTED
from .specflags import add_flags, option, spec_from_args, trainer_args_option

# Forwarded to every rank when set here (plus every HOROVOD_* and NCCL_* variable).
FORWARD_VARS = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "HWLOC_COMPONENTS",
    "ALLREDUCE_TRAIN_PROGRESS",
    "ALLREDUCE_TRAIN_TRACEBACK",
    "ALLREDUCE_TRAIN_CONNECT_FIRST",
    "ALLREDUCE_TRAIN_EXIT_DIR",
    "CUDA_VISIBLE_DEVICES",
)
FORWARD_PREFIXES = ("HOROVOD_", "NCCL_")
TRAINER = "allreduce_train"


def no_gl_probe(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``HWLOC_COMPONENTS=-gl`` unless the user chose hwloc's components.

    Why: Open MPI's hwloc (Debian's libhwloc-plugins) probes X displays through its GL plugin;
    without a local X socket Xlib tries TCP 127.0.0.1:6000+N, and display :6 is port 6006 --
    TensorBoard's default. mpirun then waits forever for an X handshake and no rank starts.
    """
    return environ if "HWLOC_COMPONENTS" in environ else {**environ, "HWLOC_COMPONENTS": "-gl"}


# Open MPI coll/tuned rules: MPI_Allreduce of >= 4 MiB on >= 3 ranks takes the ring, the rest Open MPI's
# built-in choice (see the file). On TCP links the built-in choice at 4 ranks takes up to ~2x the ring's
# bandwidth bound (docs/emulated_cluster.md); Horovod reduces through MPI_Allreduce on CPU.
RING_RULES = Path(__file__).resolve().parent / "openmpi_allreduce_ring.rules"
# A user who sets one of these chooses Open MPI's allreduce algorithm; the rules file is then left out.
TUNED_KEYS = ("coll_tuned_use_dynamic_rules", "coll_tuned_dynamic_rules_filename", "coll_tuned_allreduce_algorithm")
MPI_ALLREDUCE_CHOICES = ("ring", "auto")


def ring_rules(choice: str, app_dir: str | Path = RING_RULES.parent.parent) -> str:
    """The rules file for ``--mpi-allreduce choice`` as the ranks see it: under ``app_dir``, the checkout
    the ranks run from (an image's for Kubernetes); empty for ``auto``."""
    return str(Path(app_dir) / RING_RULES.parent.name / RING_RULES.name) if choice == "ring" else ""


def add_mpi_allreduce_arg(p: argparse.ArgumentParser, default: str | None, default_text: str, where: str = "") -> None:
    p.add_argument(
        "--mpi-allreduce",
        choices=MPI_ALLREDUCE_CHOICES,
        default=default,
        help="Open MPI's MPI_Allreduce algorithm (Horovod's on CPU): ring = the ring for 4 MiB and more "
        f"on 3+ ranks ({where}launch/{RING_RULES.name}), auto = Open MPI's built-in choice "
        f"(default: {default_text}; a --mca coll_tuned_* setting of yours wins)",
    )


def describe_mpi_allreduce(choice: str, user_mca: list[tuple[str, str]] | tuple = ()) -> str:
    """What ``--mpi-allreduce choice`` with the user's ``--mca`` pairs gives multi-host jobs, for reports."""
    if any(key in TUNED_KEYS for key, _ in user_mca):
        return "as set by --mca " + " ".join(f"{k} {v}" for k, v in user_mca if k in TUNED_KEYS)
    if choice == "ring":
        return f"ring from 4 MiB on 3+ ranks (--mpi-allreduce ring: launch/{RING_RULES.name})"
    return "Open MPI's built-in choice (--mpi-allreduce auto)"


def allreduce_mca(rules: str, user_mca: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The -mca pairs that load ``rules`` (a coll/tuned rules file path; empty: none), unless the user
    set Open MPI's allreduce choice themselves."""
    if not rules or any(key in TUNED_KEYS for key, _ in user_mca):
        return []
    return [("coll_tuned_use_dynamic_rules", "1"), ("coll_tuned_dynamic_rules_filename", rules)]


# Every job's Open MPI parameters unless the user gives the key (Horovod's guidance for TCP clusters).
DEFAULT_MCA = (("pml", "ob1"), ("btl", "^openib"))
MCA_HELP = "extra Open MPI parameter, e.g. --mca btl_tcp_if_include eth0 (repeatable)"


def add_mca_arg(p: Any, default: Any = None, help: str = MCA_HELP) -> None:
    """``--mca KEY VALUE`` (repeatable), the one declaration of the flag (its pairs: :func:`parse_mca`);
    ``default`` is what a spec field's ``add`` hook is given: the flag starts from no pairs whatever it is."""
    p.add_argument("--mca", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"), help=help)


def parse_mca(items: list[list[str]]) -> list[tuple[str, str]]:
    """The parsed ``--mca`` flags -> (key, value) pairs."""
    return [(key, value) for key, value in items]


def mca_option() -> Any:
    """A spec field that is the ``--mca`` flag (python -m launch, slurm, k8s)."""
    return option([], add=add_mca_arg, parse=parse_mca)


def merged_mca(
    user: list[tuple[str, str]], rules: str = "", defaults: tuple[tuple[str, str], ...] | list = DEFAULT_MCA
) -> list[tuple[str, str]]:
    """The job's -mca pairs in their order: the ``defaults`` whose key the user does not give (Open MPI
    refuses a parameter listed twice, e.g. --mca btl tcp,self beside btl ^openib), the pairs that load
    the allreduce ``rules`` (:func:`allreduce_mca`), then the user's."""
    mine = {key for key, _ in user}
    return [*((k, v) for k, v in defaults if k not in mine), *allreduce_mca(rules, user), *user]


def mpirun_start(mpirun: str, np: int | str, is_root: bool) -> list[str]:
    """``mpirun [--allow-run-as-root] -np NP``; ``np`` may be a word a batch shell expands ($SLURM_NTASKS)."""
    return [mpirun, *(["--allow-run-as-root"] if is_root else []), "-np", str(np)]  # Open MPI refuses root otherwise


# Horovod's guidance for Open MPI: let each rank's threads use its share of the cores
PLACEMENT = ("-bind-to", "none", "-map-by", "slot")


def mca_words(pairs: list[tuple[str, str]]) -> list[str]:
    return [w for key, value in pairs for w in ("-mca", key, value)]


def forward_words(environ: dict[str, str], extra_env: dict[str, str] | None = None) -> list[str]:
    """mpirun's ``-x`` words: the variables of ``environ`` the ranks need (:func:`forwarded_env`) by name,
    then ``extra_env``'s with their values (a name in both is passed with its value)."""
    extra_env = extra_env or {}
    words = [w for name in forwarded_env(environ) if name not in extra_env for w in ("-x", name)]
    return words + [w for name, value in extra_env.items() for w in ("-x", f"{name}={value}")]


ELASTIC = "elastic restarts (docs/faults.md)"


@dataclass
class LaunchSpec:
    """One job of ``python -m launch``: how many ranks, where, what each rank runs and how the launcher
    watches it. A field given with :func:`~launch.specflags.option` is the flag of the same name
    (:func:`make_parser` generates them, in this order); the rest are set by code."""

    np: int = option(1, "number of ranks (default: %(default)s)", flag=("-np", "--np"))
    hosts: str = option("", "comma-separated host:slots list, e.g. node1:4,node2:4", flag=("-H", "--hosts"))
    hostfile: str = option("", "Open MPI hostfile (lines like `node1 slots=4`)")
    oversubscribe: bool = option(False, "allow more ranks than cores/slots")
    mca: list[tuple[str, str]] = mca_option()  # extra -mca key value pairs
    # "ring": RING_RULES under app_dir for every rank; "auto": Open MPI's choice; None: ring when the job
    # spans hosts (-H, --hostfile, emulated hosts), else auto (:func:`allreduce_choice`)
    mpi_allreduce: str | None = option(
        None,
        add=lambda p, default: add_mpi_allreduce_arg(
            p, default, "ring with -H/--hostfile (or emulated hosts), auto on one host"
        ),
    )
    timeout: float = option(0, "stop the job after this long (default: none)", metavar="SECONDS")
    # every rank runs ``python -m module command *trainer_args`` (the command for the trainer only) ...
    command: str = option("train", "allreduce_train subcommand to run on every rank (default: %(default)s)")
    # ... or ``python script *trainer_args``
    script: str = option(
        "",
        "run your own script on every rank (`python FILE.py ARGS`; allreduce_train.fit or init "
        "inside, docs/own_model.md) instead of the trainer; ARGS after `--`",
        metavar="FILE.py",
    )
    module: str = option(
        TRAINER, "run `python -m MODULE ARGS` on every rank instead of the trainer (experiments' rank programs)"
    )
    max_restarts: int = option(
        0,
        "relaunch a failed job (a rank killed, a stall, a rank preempted) up to N times with "
        "--resume auto (default: 0); pin the run with the trainer's --name",
        metavar="N",
    )
    min_np: int = option(
        0,
        "with --max-restarts and -H/--hostfile: before a restart, ask every host to answer (a "
        "bounded ssh probe in batch mode through mpirun's own plm_rsh_agent) and continue on those "
        "that do, with up to -np ranks, as long as M fit; fewer: exit 69 (default: no probe)",
        metavar="M",
        group=ELASTIC,
    )
    host_discovery_script: str = option(
        "",
        "instead of -H/--hostfile: an executable that prints the hosts available now, one "
        "host:slots line each (as horovodrun's); run before the first attempt and before each "
        "restart (--min-np defaults to -np)",
        metavar="PATH",
        group=ELASTIC,
    )
    probe_timeout: float = option(
        PROBE_TIMEOUT,
        f"how long one host has to answer the probe (default: {PROBE_TIMEOUT:g})",
        metavar="SECONDS",
        group=ELASTIC,
    )
    grace_period: float = option(
        GRACE_PERIOD,
        "once a rank has failed or a stop was asked for (SIGTERM, Ctrl-C), the time mpirun has to "
        "end the job before the launcher kills it, e.g. when it waits for a host it cannot "
        f"reach (default: {GRACE_PERIOD:g})",
        metavar="SECONDS",
    )
    trainer_args: list[str] = trainer_args_option()
    python: str = sys.executable
    mpirun: str = "mpirun"
    # Hosts that are not real (the lab's emulated cluster): an object with exec_prefix() (where mpirun
    # runs), host_list(np) (-H unless ``hosts`` names some of them), mca() and env() (what every rank gets).
    cluster: Any = None
    app_dir: str = str(RING_RULES.parent.parent)  # the checkout the ranks run from (an image's for Kubernetes)


def forwarded_env(environ: dict[str, str]) -> list[str]:
    names = [v for v in FORWARD_VARS if v in environ]
    names += sorted(v for v in environ if v.startswith(FORWARD_PREFIXES))
    return names


def allreduce_choice(spec: LaunchSpec) -> str:
    """``--mpi-allreduce`` as given, else ring when the job spans hosts and auto on one host."""
    return spec.mpi_allreduce or ("ring" if spec.hosts or spec.hostfile or spec.cluster else "auto")


def mca_pairs(spec: LaunchSpec) -> list[tuple[str, str]]:
    """The -mca pairs of ``spec``'s mpirun line (an emulated cluster's transport replaces btl ^openib)."""
    defaults = [DEFAULT_MCA[0], *spec.cluster.mca()] if spec.cluster else DEFAULT_MCA
    return merged_mca(spec.mca, ring_rules(allreduce_choice(spec), spec.app_dir), defaults)


def build_command(spec: LaunchSpec, environ: dict[str, str] | None = None, is_root: bool | None = None) -> list[str]:
    """The mpirun argument list for ``spec``."""
    environ = dict(os.environ) if environ is None else environ
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    if spec.np < 1:
        raise ValueError(f"-np must be >= 1 (got {spec.np})")
    if spec.hosts and spec.hostfile:
        raise ValueError("give either -H or --hostfile, not both")
    cluster = spec.cluster
    # mpirun runs inside the emulated cluster's head namespace, where the switch is
    cmd = [*cluster.exec_prefix()] if cluster else []
    if "HWLOC_COMPONENTS" not in environ:
        # In the command itself, so that the printed line is safe to copy: see no_gl_probe
        cmd += ["env", "HWLOC_COMPONENTS=-gl"]
        environ = no_gl_probe(environ)  # ... and forwarded to the ranks with -x
    cmd += mpirun_start(spec.mpirun, spec.np, is_root)
    if spec.hosts or cluster:  # an emulated cluster's hosts by name after an elastic restart, else spread evenly
        cmd += ["-H", spec.hosts or cluster.host_list(spec.np)]
    if spec.hostfile:
        cmd += ["--hostfile", spec.hostfile]
    if spec.oversubscribe:
        cmd.append("--oversubscribe")
    cmd += [*PLACEMENT, *mca_words(mca_pairs(spec))]
    cmd += forward_words(environ, cluster.env() if cluster else None)
    program = [spec.script] if spec.script else ["-m", spec.module, *([spec.command] if spec.module == TRAINER else [])]
    return [*cmd, spec.python, *program, *spec.trainer_args]


def make_parser() -> argparse.ArgumentParser:
    """``python -m launch``'s flags: :class:`LaunchSpec`'s, and --dry-run."""
    p = argparse.ArgumentParser(
        prog="python -m launch",
        description="Run allreduce_train under mpirun. Trainer arguments go after `--`. For a scheduler: "
        "`python -m launch slurm --help` (sbatch), `python -m launch k8s --help` (Kubernetes MPIJob).",
        epilog="example: python -m launch -np 4 -H node1:2,node2:2 -- --model lenet5 --epochs 2",
    )
    add_flags(p, LaunchSpec)
    p.add_argument("--dry-run", action="store_true", help="print the mpirun line and exit")
    return p


# Flags that moved to the lab with the emulated hosts: one line says where (``python -m lab.emulation``).
MOVED_TO_LAB = ("--emulate-hosts", "--link-rate")


def main(argv: list[str] | None = None, emulation: Any = None) -> int:
    """``python -m launch``. ``emulation``: the lab's emulated hosts plug in here (lab/emulation/__main__.py) as
    a transport: an object with ``add_arguments(parser)``, ``cluster(args)`` (the cluster, or None; ValueError
    for a bad flag), ``unavailable_reason()``, ``default_timeout`` and ``run(cluster, job)``, which builds the
    hosts, returns ``job(between)`` (``between()``: what to clear on the hosts before a restart) and removes them."""
    parser = make_parser()
    if emulation:
        emulation.add_arguments(parser)
    else:
        for name in MOVED_TO_LAB:
            parser.add_argument(name, dest="moved_" + name[2:].replace("-", "_"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    moved = [n for n in MOVED_TO_LAB if getattr(args, "moved_" + n[2:].replace("-", "_"), None) is not None]
    if moved:
        print(
            f"launch: error: {moved[0]} moved to the lab with the emulated hosts: run `python -m lab.emulation` "
            "with the same flags (docs/emulated_cluster.md)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        spec = spec_from_args(LaunchSpec, args, cluster=emulation.cluster(args) if emulation else None)
        check_run_flags(spec)
        if spec.max_restarts and spec.module == TRAINER:
            spec = dataclasses.replace(spec, trainer_args=pinned_name(spec.trainer_args))
        check_host_flags(spec)
        # fixed here: hosts a discovery script names later do not change it
        spec = dataclasses.replace(spec, mpi_allreduce=allreduce_choice(spec))
        if spec.hostfile and not os.path.isfile(spec.hostfile):
            raise ValueError(f"--hostfile {spec.hostfile}: file not found")
        cores = usable_cores()
        allocated = any(v in os.environ for v in ("SLURM_JOB_ID", "PBS_JOBID"))  # slots come from the scheduler
        if not (spec.hosts or spec.hostfile or spec.cluster or spec.oversubscribe or allocated) and spec.np > cores:
            # horovodrun and torchrun start any number of ranks on one host; Open MPI refuses with a
            # page of text. Say it in one line and go on.
            print(
                f"launch: {spec.np} ranks on {cores} core(s): adding --oversubscribe (the ranks share the cores)",
                file=sys.stderr,
                flush=True,
            )
            spec = dataclasses.replace(spec, oversubscribe=True)
        env = dict(os.environ)
        env.pop(EXIT_DIR_ENV, None)
        build_command(spec, environ=env)  # refuses a bad -np or -H with --hostfile before anything runs
        elastic = make_elastic(spec)
        if elastic and elastic.script:  # the discovery script names the first attempt's hosts too
            hosts, np = elastic.first(env)
            if np < elastic.min_np:
                print(
                    f"launch: elastic: {np} rank(s) fit on the hosts --host-discovery-script gives "
                    f"({host_arg(hosts) or 'none'}), fewer than --min-np {elastic.min_np}",
                    file=sys.stderr,
                )
                return EXIT_STALLED
            spec = dataclasses.replace(spec, np=np, hosts=host_arg(hosts))
        cmd = build_command(spec, environ=env)  # sets HWLOC_COMPONENTS=-gl in the line unless env has it
    except ValueError as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if shutil.which(spec.mpirun) is None:
        print(
            "launch: error: mpirun not found; install Open MPI (apt-get install openmpi-bin) or run `make install`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if spec.cluster and not args.dry_run:
        reason = emulation.unavailable_reason()
        if reason:
            print(f"launch: error: --emulate-hosts: {reason}", file=sys.stderr)
            return EXIT_USAGE
    if args.dry_run and spec.cluster:
        for setup in spec.cluster.setup_commands():
            print("+ " + shlex.join(setup))
    if args.dry_run:
        print("+ " + shlex.join(cmd), flush=True)
        return EXIT_OK
    if sys.stderr.isatty() and "ALLREDUCE_TRAIN_PROGRESS" not in env:
        # Under mpirun every rank writes into a pipe, so the trainer cannot see that a person is
        # watching; tell it, so rank 0 draws its progress bar.
        env["ALLREDUCE_TRAIN_PROGRESS"] = "1"
    timeout = spec.timeout or (emulation.default_timeout if spec.cluster else 0)
    with exit_dir(env):  # see run_bounded
        cmd = build_command(spec, environ=env)
        print("+ " + shlex.join(cmd), flush=True)

        def job(between: Callable[[], None] | None = None) -> int:
            return supervise(spec, cmd, env, timeout, elastic=elastic, between=between)

        if spec.cluster:
            return emulation.run(spec.cluster, job)
        try:
            return job()
        except KeyboardInterrupt:
            print("launch: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED


def check_run_flags(spec: LaunchSpec) -> None:
    """ValueError naming the flag when the run's own flags are out of range or what every rank runs is unclear."""
    if spec.timeout < 0:
        raise ValueError(f"--timeout must be >= 0 (got {spec.timeout:g})")
    if spec.max_restarts < 0:
        raise ValueError("--max-restarts must be >= 0")
    if spec.grace_period <= 0:
        raise ValueError(f"--grace-period must be > 0 (got {spec.grace_period:g})")
    if spec.script and spec.module != TRAINER:
        raise ValueError("--script and --module both name what every rank runs: give one")
    if spec.script and not os.path.isfile(spec.script):
        raise ValueError(f"--script {spec.script}: file not found")


def check_host_flags(spec: LaunchSpec) -> None:
    """ValueError naming the flag when the hosts' flags (-H, --hostfile, the emulated cluster,
    --min-np, --host-discovery-script, --probe-timeout) do not go together."""
    if spec.min_np < 0 or spec.min_np > spec.np:
        raise ValueError(f"--min-np must be between 0 and -np {spec.np} (got {spec.min_np})")
    if spec.min_np and not spec.max_restarts:
        raise ValueError("--min-np acts when the job restarts: give --max-restarts too")
    if spec.probe_timeout <= 0:
        raise ValueError(f"--probe-timeout must be > 0 (got {spec.probe_timeout:g})")
    if spec.host_discovery_script and (spec.hosts or spec.hostfile or spec.cluster):
        raise ValueError("--host-discovery-script gives the hosts: leave out -H/--hostfile/--emulate-hosts")
    if spec.cluster and (spec.hosts or spec.hostfile):
        raise ValueError("give either --emulate-hosts or -H/--hostfile, not both")
    if spec.min_np and not (spec.hosts or spec.hostfile or spec.host_discovery_script or spec.cluster):
        raise ValueError("--min-np needs the hosts to ask: give -H, --hostfile or --host-discovery-script")


def make_elastic(spec: LaunchSpec) -> Elastic | None:
    """The elastic step for ``--min-np`` / ``--host-discovery-script`` (None without them)."""
    if not (spec.min_np or spec.host_discovery_script):
        return None
    if spec.host_discovery_script:
        hosts = []
    elif spec.cluster:
        hosts = parse_host_list(spec.cluster.host_list(spec.np))
    elif spec.hostfile:
        hosts = read_hostfile(spec.hostfile)
    else:
        hosts = parse_host_list(spec.hosts)
    return Elastic(
        np=spec.np,
        min_np=spec.min_np or spec.np,
        hosts=hosts,
        script=spec.host_discovery_script,
        oversubscribe=spec.oversubscribe,
        mca=mca_pairs(spec),  # the agent is looked up in the line's -mca pairs: the probe goes where mpirun goes
        exec_prefix=list(spec.cluster.exec_prefix()) if spec.cluster else [],
        probe_timeout=spec.probe_timeout,
    )


def usable_cores() -> int:
    """The cores this process may run on, counted as Open MPI counts a host's slots without a
    hostfile: cores, not hardware threads."""
    cpus = os.sched_getaffinity(0)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            return len(cpus)  # no topology (a container without /sys): one slot per CPU
    return len(cores)


def pinned_name(args: list[str]) -> list[str]:
    """Trainer arguments with a fixed ``--name``: a restart must find the run's checkpoint."""
    if "--name" in args or any(a.startswith("--name=") for a in args) or "--config" in args:
        return args
    name = f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"launch: --max-restarts: the run is named {name} (--name), so that a restart resumes it", flush=True)
    return [*args, "--name", name]


def resuming(args: list[str]) -> list[str]:
    """Trainer arguments with ``--resume auto`` (replacing any other --resume)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--resume":
            skip = True
        elif not a.startswith("--resume="):
            out.append(a)
    return [*out, "--resume", "auto"]


def supervise(
    spec: LaunchSpec,
    cmd: list[str],
    env: dict[str, str],
    timeout: float,
    elastic: Elastic | None = None,
    between: Callable[[], None] | None = None,
) -> int:
    """Run the job; relaunch it with ``--resume auto`` after a failure, up to ``spec.max_restarts`` times;
    ``spec.grace_period``: the time mpirun has to end the job once a rank failed or a stop was asked for.

    Not restarted: success, usage errors, divergence (each would fail the same way again), the
    launcher's own --timeout, and a stop signal sent to this launcher (the whole job is being
    preempted: exit 75 and let the scheduler requeue it). ``elastic``: before a restart, the hosts
    that answer and the ranks that fit on them (launch/elastic.py); fewer than --min-np: exit 69.
    ``between()``: the transport's cleanup before a restart (an emulated cluster ends what the
    failed attempt left on its hosts).
    """
    given = spec  # the user's hosts (or hostfile): used again while every host answers
    max_restarts = spec.max_restarts
    for attempt in range(max_restarts + 1):
        stops: list[str] = []
        rc = run_bounded(cmd, env, timeout, stops, grace=spec.grace_period, np=spec.np)
        if rc in NOT_RESTARTED or stops or attempt == max_restarts:
            return rc
        print(
            f"launch: the job ended with exit {rc} ({why(rc)}); restart {attempt + 1} of {max_restarts} "
            "with --resume auto",
            file=sys.stderr,
            flush=True,
        )
        spec = dataclasses.replace(spec, trainer_args=resuming(spec.trainer_args))
        if between is not None:
            between()
        if elastic is not None:
            try:
                placed = elastic.step(env, spec.np, lambda line: print(line, file=sys.stderr, flush=True))
            except ElasticError as e:
                print(f"launch: error: {e}", file=sys.stderr, flush=True)
                return EXIT_USAGE
            if placed is None:
                return EXIT_STALLED
            hosts, np = placed
            if hosts == elastic.hosts:
                spec = dataclasses.replace(spec, np=np, hosts=given.hosts, hostfile=given.hostfile)
            else:
                spec = dataclasses.replace(spec, np=np, hosts=host_arg(hosts), hostfile="")
        cmd = build_command(spec, environ=env)
        print("+ " + shlex.join(cmd), flush=True)
    return rc
