"""One module per `stoker` command: `add_parser(sub)` makes its options, `check(parser, args)` (where it has
one) refuses at parse time what cannot work together, and `run(args)` runs it (stoker.cli)."""
