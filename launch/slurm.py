"""Run the trainer on a Slurm cluster: write (and submit) a readable sbatch script.

    python -m launch slurm --nodes 2 -- --model lenet5 --epochs 2            # write runs/slurm-<time>.sbatch
    python -m launch slurm --nodes 2 --submit -- --model lenet5 --epochs 2   # ... submit it and follow the job
    python -m launch slurm --nodes 4 --ntasks-per-node 2 --srun --dry-run -- --strategy ps

The script is printed before anything is submitted, like the mpirun line of ``python -m launch``.
Inside the allocation it runs the same mpirun line (Open MPI reads the nodes from Slurm: no host
list; ``-np $SLURM_NTASKS``) or, with ``--srun``, ``srun --mpi=pmix`` with the same Open MPI
settings as environment variables. Preemption is wired in: Slurm sends the batch shell SIGUSR1 ``--grace``
seconds before the time limit (``--signal=B:USR1@GRACE``), the shell passes it to the job, every
rank finishes its step, writes the checkpoint and exits 75; the shell then requeues the job
(``--requeue``), and the requeued run continues from that checkpoint (``--resume auto``) in the
same run directory, ``runs/slurm-<job id>/``. Job output goes to ``runs/slurm-<job id>.out``.

With ``--submit`` the launcher checks the request against ``sinfo`` first (partition, node count,
CPUs, GPUs), then follows the job by polling ``squeue`` (``sbatch --wait`` polls only every 10 s),
prints the job's output as it grows, and exits with the job's exit code. Without ``SLURM_CONF`` and
``/etc/slurm/slurm.conf`` it uses the emulated cluster of ``python -m lab.emulation.slurm_cluster up``.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .exitcodes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, EXIT_TIMEOUT, EXIT_USAGE
from .mpirun import (
    PLACEMENT,
    TRAINER,
    add_mpi_allreduce_arg,
    forward_words,
    mca_option,
    mca_words,
    merged_mca,
    mpirun_start,
    no_gl_probe,
    ring_rules,
)
from .specflags import add_flags, option, spec_from_args, trainer_args_option

# The lab's emulated Slurm cluster (lab/emulation/slurm_cluster.py) keeps its state, slurm.conf included, here;
# without SLURM_CONF or /etc/slurm/slurm.conf the clients use it (slurm_env).
EMULATED_STATE_DIR = Path("/tmp/allreduce-train-slurm")

NTASKS = "$SLURM_NTASKS"  # expanded by the batch shell: every task of the allocation is a rank
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
    "SPECIAL_EXIT",
}
POLL_S = 0.5
SQUEUE_PATIENCE = 120.0  # seconds without an answer from squeue before --submit gives up following
_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")


class SlurmError(RuntimeError):
    """Bad input or an unusable cluster; the message names what is wrong and how to fix it."""


@dataclass
class SlurmJob:
    """What to ask Slurm for and what every task runs."""

    nodes: int = option(2, "nodes (default: %(default)s)")
    ntasks_per_node: int = option(1, "ranks per node (default: %(default)s; GPUs: one per GPU)")
    cpus_per_task: int = option(0, "CPUs per rank (default: Slurm's, 1)")  # 0: leave it to Slurm
    gpus_per_node: int = option(0, "GPUs per node (default: none)")
    # Slurm's [D-]HH:MM:SS, MM, ...; empty: the partition's limit
    time: str = option("", "time limit, e.g. 2:00:00 (default: the partition's)")
    partition: str = option("", "partition (default: the cluster's default)")
    account: str = option("", "account to charge (default: yours)")
    job_name: str = option("allreduce-train", "job name (default: %(default)s)")
    output: str = option("runs/slurm-%j.out", "job log; %%j is the job id (default: %(default)s)")
    grace: int = option(  # seconds between SIGUSR1 and the time limit
        120, "seconds before the time limit at which the job checkpoints and requeues (default: %(default)s)"
    )
    srun: bool = option(False, "start the ranks with srun --mpi=pmix instead of mpirun")
    mca: list[tuple[str, str]] = mca_option()
    # launch/openmpi_allreduce_ring.rules for MPI_Allreduce; "auto": Open MPI's choice
    mpi_allreduce: str = option("ring", add=lambda p, default: add_mpi_allreduce_arg(p, default, default))
    trainer_args: list[str] = trainer_args_option()
    python: str = sys.executable

    def __post_init__(self) -> None:
        for name in ("nodes", "ntasks_per_node"):
            if getattr(self, name) < 1:
                raise SlurmError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        for name in ("cpus_per_task", "gpus_per_node", "grace"):
            if getattr(self, name) < 0:
                raise SlurmError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(self, name)})")
        if self.time and not _TIME_RE.match(self.time):
            raise SlurmError(f"--time {self.time!r}: use Slurm's format, e.g. 30, 2:00:00 or 1-12:00:00")
        for name in ("partition", "account", "job_name", "output"):
            value = getattr(self, name)
            if any(c.isspace() for c in value):
                raise SlurmError(f"--{name.replace('_', '-')} {value!r}: no spaces")

    @property
    def run_name(self) -> str:
        """The trainer's run directory name: the user's ``--name``, else one per job (kept across requeues)."""
        for i, arg in enumerate(self.trainer_args):
            if arg == "--name" and i + 1 < len(self.trainer_args):
                return self.trainer_args[i + 1]
            if arg.startswith("--name="):
                return arg.split("=", 1)[1]
        return ""


def sbatch_directives(job: SlurmJob) -> list[str]:
    opts = [f"--job-name={job.job_name}", f"--nodes={job.nodes}", f"--ntasks-per-node={job.ntasks_per_node}"]
    if job.cpus_per_task:
        opts.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.gpus_per_node:
        opts.append(f"--gpus-per-node={job.gpus_per_node}")
    if job.time:
        opts.append(f"--time={job.time}")
    if job.partition:
        opts.append(f"--partition={job.partition}")
    if job.account:
        opts.append(f"--account={job.account}")
    opts += [
        f"--output={job.output}",
        "--open-mode=append",  # a requeued run adds to the same log instead of truncating it
        f"--signal=B:USR1@{job.grace}",  # to the batch shell only; it passes the signal on
        "--requeue",
    ]
    return [f"#SBATCH {o}" for o in opts]


def job_command(job: SlurmJob, environ: dict[str, str], is_root: bool) -> tuple[list[str], list[list[str]]]:
    """(lines that set the environment, the job step's words in groups: one line each when printed).

    Words are shell-quoted, except ``$SLURM_NTASKS``, ``"${resume[@]}"`` and the default run
    name ``"slurm-$SLURM_JOB_ID"``, which the batch shell expands."""
    name = [] if job.run_name else ["--name", '"slurm-$SLURM_JOB_ID"']  # the same directory after a requeue
    program = [job.python, "-m", TRAINER, "train"]
    mca = merged_mca(job.mca, ring_rules(job.mpi_allreduce))  # the rules: a path every node sees, like job.python
    if job.srun:
        env = [(f"OMPI_MCA_{k}", v) for k, v in mca]
        # Not --kill-on-bad-exit: after a preemption every rank exits 75 by itself, and srun killing the
        # last ones as soon as the first has exited would turn the job's 75 into a failure (no requeue).
        groups = [[shlex.quote(w) for w in ("srun", "--mpi=pmix")]]
    else:
        # python -m launch's line without hosts: Open MPI reads the allocation, every task is a rank
        env = []
        head = [*mpirun_start("mpirun", NTASKS, is_root), *PLACEMENT, *mca_words(mca)]
        groups = [
            [w if w == NTASKS else shlex.quote(w) for w in head],
            [shlex.quote(w) for w in forward_words(environ)],
        ]
    # launch run: the launcher's bound (launch/run.py): a stop that no rank answers, or a failed rank
    # here while mpirun waits for a node it cannot reach, ends the step within its grace period
    groups.insert(0, [shlex.quote(w) for w in (job.python, "-m", "launch", "run", "--")])
    # --expect-hosts: every rank refuses to train if the ranks did not land on the allocation's nodes
    groups.append([*map(shlex.quote, program), '"${resume[@]}"', *name, "--expect-hosts", str(job.nodes)])
    if job.trainer_args:
        groups.append([shlex.quote(a) for a in job.trainer_args])
    return [f"export {k}={shlex.quote(v)}" for k, v in env], [g for g in groups if g]


def render_script(
    job: SlurmJob, environ: dict[str, str] | None = None, is_root: bool | None = None, note: str = ""
) -> str:
    """The sbatch script for ``job``: directives, environment, the job step and the preemption logic."""
    environ = no_gl_probe(dict(os.environ) if environ is None else environ)
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    env_lines, words = job_command(job, environ, is_root)
    step = " \\\n    ".join(line for group in words for line in _wrap(group))
    how = "srun --mpi=pmix (PMIx starts the ranks)" if job.srun else "mpirun (Open MPI reads the allocation)"
    lines = [
        "#!/bin/bash",
        f"# allreduce_train on Slurm, written by `python -m launch slurm`{note}.",
        f"# {job.nodes} node(s) x {job.ntasks_per_node} rank(s), started with {how}.",
        *sbatch_directives(job),
        "",
        "set -u",
        "# hwloc's GL plugin probes X displays, and display :6 is TensorBoard's port 6006: mpirun would hang.",
        f"export HWLOC_COMPONENTS={shlex.quote(environ['HWLOC_COMPONENTS'])}",
        *env_lines,
        "",
        'echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST: $(date -u)"',
        "# A requeued job continues from its checkpoint in the same run directory.",
        "resume=()",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then resume=(--resume auto); fi',
        "",
        f"# Slurm sends SIGUSR1 to this shell {job.grace} s before the time limit; pass it to the job: every rank",
        f"# finishes its step, writes the checkpoint and exits {EXIT_PREEMPTED}.",
        'trap \'echo "job $SLURM_JOB_ID: SIGUSR1, checkpointing"; kill -USR1 "$job" 2>/dev/null\' USR1',
        step + " &",
        "job=$!",
        'while kill -0 "$job" 2>/dev/null; do wait "$job"; done  # a trap cuts `wait` short: wait again',
        'wait "$job"; rc=$?',
        f'if [ "$rc" -eq {EXIT_PREEMPTED} ]; then',
        '    echo "job $SLURM_JOB_ID: checkpoint written, requeueing"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def _wrap(words: list[str], width: int = 110) -> list[str]:
    """Group the command's words into lines of about ``width`` characters (continued with ``\\``)."""
    lines, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return lines + [cur]


# ------------------------------------------------------------------ the cluster


def slurm_env(environ: dict[str, str]) -> tuple[dict[str, str], str]:
    """The environment for Slurm's clients, and a note when it points at the emulated cluster."""
    if "SLURM_CONF" in environ or os.path.exists("/etc/slurm/slurm.conf"):
        return environ, ""
    conf = EMULATED_STATE_DIR / "slurm.conf"
    if conf.exists():
        return {**environ, "SLURM_CONF": str(conf)}, f"using the emulated cluster (SLURM_CONF={conf})"
    return environ, ""


def _client(cmd: list[str], env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"`{shlex.join(cmd)}` did not answer within {timeout:g}s; is slurmctld running?") from e


def check_request(job: SlurmJob, env: dict[str, str]) -> None:
    """Compare the request with what ``sinfo`` reports, so that an impossible job fails here, in one line."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        raise SlurmError(
            "sbatch/sinfo not found: run on a Slurm login node, or install slurm-client "
            "and start the emulated cluster (python -m lab.emulation.slurm_cluster up)"
        )
    proc = _client(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%G"], env)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise SlurmError(
            f"no Slurm controller answers ({err}); start the emulated cluster with "
            "`python -m lab.emulation.slurm_cluster up` or set SLURM_CONF"
        )
    parts: dict[str, dict[str, tuple[int, str]]] = {}
    default = ""
    for line in proc.stdout.splitlines():
        node, part, cpus, gres = line.strip().split("|")
        if part.endswith("*"):
            part = default = part[:-1]
        parts.setdefault(part, {})[node] = (int(cpus.rstrip("+")), gres)
    name = job.partition or default
    if name not in parts:
        have = ", ".join(sorted(parts)) or "none"
        if job.partition:
            raise SlurmError(f"--partition {job.partition}: no such partition; this cluster has: {have}")
        raise SlurmError(f"the cluster has no default partition; choose one with --partition ({have})")
    nodes = parts[name]
    if job.nodes > len(nodes):
        raise SlurmError(f"--nodes {job.nodes}: partition {name} has only {len(nodes)} node(s)")
    want = job.ntasks_per_node * max(1, job.cpus_per_task)
    fit = [n for n, (cpus, _) in nodes.items() if cpus >= want]
    if len(fit) < job.nodes:
        raise SlurmError(
            f"--ntasks-per-node {job.ntasks_per_node} x --cpus-per-task {max(1, job.cpus_per_task)} = "
            f"{want} CPUs per node: only {len(fit)} node(s) of partition {name} have that many "
            f"(most: {max(c for c, _ in nodes.values())})"
        )
    if job.gpus_per_node and not any("gpu" in g for _, g in nodes.values()):
        raise SlurmError(f"--gpus-per-node {job.gpus_per_node}: partition {name} has no GPUs (no gres/gpu)")


def submit(script: Path, env: dict[str, str]) -> str:
    proc = _client(["sbatch", "--parsable", str(script)], env)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise SlurmError(f"sbatch refused the job: {err.removeprefix('sbatch: error: ')}")
    return proc.stdout.strip().split(";")[0]


def job_state(job_id: str, env: dict[str, str]) -> tuple[str, str] | None:
    """(state, node list) from squeue, which keeps finished jobs for a while (``-t all``); ('', '') once
    gone; ``None`` when squeue did not answer (a busy controller: ask again)."""
    try:
        proc = _client(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%N"], env)
    except SlurmError:
        return None
    out = proc.stdout.strip()
    if proc.returncode != 0:
        return None
    if not out:
        return "", ""
    state, nodes = out.splitlines()[0].split("|", 1)
    return state, nodes


def exit_code(job_id: str, env: dict[str, str]) -> int | None:
    """The batch script's exit status (or 128 + signal), from ``scontrol show job``."""
    out = _client(["scontrol", "-o", "show", "job", job_id], env).stdout
    m = re.search(r"\bExitCode=(\d+):(\d+)", out)
    if not m:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return code if code or not sig else 128 + sig


def output_path(job: SlurmJob, job_id: str, cwd: Path) -> Path:
    path = job.output.replace("%j", job_id).replace("%x", job.job_name)
    return cwd / path


def follow(job: SlurmJob, job_id: str, env: dict[str, str], timeout: float, out: TextIO = sys.stdout) -> int:
    """Print state changes and the job's output until it ends; its exit code (124 past ``timeout``)."""
    log = output_path(job, job_id, Path.cwd())
    offset, last = 0, ("", "")
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a read may end inside a character
    deadline = time.monotonic() + timeout if timeout else None
    answered = time.monotonic()

    def drain() -> None:
        nonlocal offset
        try:
            with open(log, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            return
        offset += len(data)
        if data:
            out.write(decode.decode(data))
            out.flush()

    while True:
        polled = job_state(job_id, env)
        drain()
        if polled is None:
            if time.monotonic() - answered > SQUEUE_PATIENCE:
                print(
                    f"launch slurm: error: squeue has not answered for {SQUEUE_PATIENCE:g}s; job {job_id} may "
                    f"still run (squeue -j {job_id}, scancel {job_id}); its output: {log}",
                    file=sys.stderr,
                )
                return EXIT_ERROR
            time.sleep(POLL_S)
            continue
        answered = time.monotonic()
        state, nodes = polled
        if (state, nodes) != last and state:
            print(f"launch slurm: job {job_id} {state}" + (f" on {nodes}" if nodes else ""), file=out, flush=True)
            last = (state, nodes)
        if state in FINAL_STATES or not state:
            time.sleep(POLL_S)  # the last lines may still be on their way to the file
            drain()
            code = exit_code(job_id, env)
            if code is None:
                print(
                    f"launch slurm: error: job {job_id} is no longer known to Slurm; its output: {log}", file=sys.stderr
                )
                return EXIT_ERROR
            return code
        if deadline and time.monotonic() > deadline:
            print(f"launch slurm: error: job {job_id} ran past --timeout {timeout:g}s; cancelling it", file=sys.stderr)
            _client(["scancel", job_id], env)
            return EXIT_TIMEOUT
        time.sleep(POLL_S)


# ------------------------------------------------------------------ command line


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch slurm",
        description="Write a Slurm batch script that runs allreduce_train across nodes (and with --submit, "
        "submit it and follow the job). Trainer arguments go after `--`.",
        epilog="example: python -m launch slurm --nodes 2 --time 1:00:00 --submit -- --model lenet5 --epochs 2",
    )
    add_flags(p, SlurmJob)
    p.add_argument("--script", default="", help="where to write the script (default: runs/slurm-<time>.sbatch)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the script only; write and submit nothing")
    mode.add_argument("--submit", action="store_true", help="submit the script and follow the job to its end")
    p.add_argument(
        "--timeout",
        type=float,
        default=0,
        metavar="SECONDS",
        help="with --submit: cancel the job after this long (default: none)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    job_id = ""
    env = dict(os.environ)
    try:
        if args.timeout < 0:
            raise SlurmError(f"--timeout must be >= 0 (got {args.timeout:g})")
        job = spec_from_args(SlurmJob, args)
        script = Path(args.script or time.strftime("runs/slurm-%Y%m%d-%H%M%S.sbatch"))
        note = "" if args.dry_run else f"; submit with: sbatch {script}"
        text = render_script(job, note=note)
        if args.submit:
            env, using = slurm_env(env)
            if using:
                print(f"launch slurm: {using}", flush=True)
            check_request(job, env)
        print(text, end="", flush=True)
        if args.dry_run:
            return EXIT_OK
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
        output_path(job, "0", Path.cwd()).parent.mkdir(parents=True, exist_ok=True)  # Slurm does not create it
        if not args.submit:
            print(f"launch slurm: wrote {script}; submit with: sbatch {script}")
            return EXIT_OK
        print(f"+ sbatch {shlex.quote(str(script))}", flush=True)
        job_id = submit(script, env)
        print(f"launch slurm: submitted job {job_id}; output: {output_path(job, job_id, Path('.'))}", flush=True)
        return follow(job, job_id, env, args.timeout)
    except SlurmError as e:
        print(f"launch slurm: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"launch slurm: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if job_id:
            subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)
            print(f"launch slurm: interrupted; cancelled job {job_id}", file=sys.stderr)
        return EXIT_INTERRUPTED
