"""One module per ``ctbuild`` subcommand, each with ``add_parser(sub, name, summary)``."""
