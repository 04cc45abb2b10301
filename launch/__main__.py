import sys

from .mpirun import main

if sys.argv[1:2] == ["slurm"]:  # python -m launch slurm ...: write/submit a Slurm batch script instead of running mpirun
    from .slurm import main as slurm_main

    raise SystemExit(slurm_main(sys.argv[2:]))
raise SystemExit(main())
