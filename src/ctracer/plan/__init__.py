"""Stage 2, the plan: which functions reach the struct (`discovery`), the mini struct of the
fields a trace records (`mini`, packed by `reorganize`) and pahole's layout text (`pahole`).
Types are spelled as C by the one speller, `ctracer.debuginfo.cdecl`."""
