from minisgl.tools.pipeline.cli import main

main()
