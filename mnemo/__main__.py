"""`python -m mnemo`: the `mnemo` command line."""

from mnemo.cli import main

main()
