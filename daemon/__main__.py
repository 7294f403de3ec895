import sys

from ledgerd.daemon.main import main

sys.exit(main())
