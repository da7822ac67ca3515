import sys

from nodeside.deviceplugin.main import main

sys.exit(main())
