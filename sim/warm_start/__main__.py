import sys

from sim.warm_start.cli import main

sys.exit(main())
