from jupyter_gpu.cli import main

raise SystemExit(main())
