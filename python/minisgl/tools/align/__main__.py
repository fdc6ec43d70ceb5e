import sys

from minisgl.tools.align.driver import main

sys.exit(main())
