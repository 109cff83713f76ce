from pycrid.cli import main

raise SystemExit(main())
