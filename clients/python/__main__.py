import sys

from clients.python.cli import main

sys.exit(main())
