"""One module per ``ctracer`` subcommand: ``add_arguments(parser)`` and ``run(args)``."""
