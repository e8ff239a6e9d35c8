"""ctracer callgraph (being built)."""


def add_arguments(parser):
    pass


def run(args):
    raise NotImplementedError
