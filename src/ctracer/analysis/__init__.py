"""The analysis stage: what a trace says, computed from its model, for the renderers
and commands above it (`diff`: what changed between two runs)."""
