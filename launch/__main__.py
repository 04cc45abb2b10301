import sys

from .mpirun import main

if sys.argv[1:2] == ["k8s"]:  # python -m launch k8s ...: render a Kubeflow TrainJob or MPIJob instead of running mpirun
    from .k8s import main as k8s_main

    raise SystemExit(k8s_main(sys.argv[2:]))
if sys.argv[1:2] == [
    "slurm"
]:  # python -m launch slurm ...: write/submit a Slurm batch script instead of running mpirun
    from .slurm import main as slurm_main

    raise SystemExit(slurm_main(sys.argv[2:]))
if sys.argv[1:2] == ["run"]:  # python -m launch run -- MPIRUN LINE: the launcher's bound around a ready-made line
    from .run import main as run_main

    raise SystemExit(run_main(sys.argv[2:]))
raise SystemExit(main())
