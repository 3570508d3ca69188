import sys

from gemmgen.cli import main

sys.exit(main())
