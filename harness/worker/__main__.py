from harness.worker.main import main

raise SystemExit(main())
