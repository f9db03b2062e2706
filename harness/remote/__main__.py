from harness.remote.launcher import main

raise SystemExit(main())
