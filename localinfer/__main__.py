import sys

from localinfer.cli import main

sys.exit(main())
