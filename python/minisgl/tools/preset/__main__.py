import sys

from minisgl.tools.preset.cli import main

sys.exit(main())
