"""Stage 2, the plan: which functions reach the struct (`discovery`), the mini struct of the
fields a trace records (`mini`, packed by `reorganize`), pahole's layout text (`pahole`),
and the one speller of C declarations (`cdecl`)."""
