from kinfer.cli import main

raise SystemExit(main())
