"""`python -m relstream` is the `relstream` command."""

from relstream.cli import main

main()
