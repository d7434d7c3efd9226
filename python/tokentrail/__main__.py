import sys

from tokentrail.cli import main

sys.exit(main())
