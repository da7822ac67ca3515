from nodeside.daemon.main import main

raise SystemExit(main())
