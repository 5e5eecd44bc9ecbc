"""`python -m relstream_lab` is the `relstream-lab` command."""

from relstream_lab.cli import main

main()
