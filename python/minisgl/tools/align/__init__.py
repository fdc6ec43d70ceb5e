"""`python -m minisgl.tools.align`: teacher-forced alignment of a candidate server against a
reference (docs/alignment.md). driver.py runs the stages; the rest are its parts."""
