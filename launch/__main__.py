from .mpirun import main

raise SystemExit(main())
