import sys

from efd.cli import main

sys.exit(main())
