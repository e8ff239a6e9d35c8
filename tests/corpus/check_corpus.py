#!/usr/bin/env python3
"""Kernel-corpus oracle: ctracer's type analysis on Debian's kernel debug package
(linux-image-6.1.0-50-cloud-amd64-dbg), held against pahole, pfunct, llvm-dwarfdump and nm.

Checks, each printed with its counts (exit status 1 when any fails, 2 when the corpus or
a tool is missing):

  a. the methods of sock and sk_buff (vmlinux DWARF) and of nfs_fh (nfs.ko DWARF) include
     every function ``pfunct --class`` lists, and every name ctracer adds is explained by
     the pfunct criterion it misses (inline only; reached through an alias, a holder, a
     return value or ``**``; a qualified or typedef'd parameter; a compile unit that only
     declares the struct, confirmed with llvm-dwarfdump);
  b. the layouts of sampled structs (fixed seed, plus sock, sk_buff, nfs_fh, task_struct)
     from the vmlinux DWARF equal ``pahole -F dwarf -C``, through the path ``ctracer
     struct`` takes (checked against the command itself for the named structs);
  c. the vmlinux's own .BTF section gives the same methods of sock and sk_buff as its
     DWARF (by function name and kind; what only DWARF has is explained: functions
     without code, functions whose code exists only as a compiler clone) and the same
     layouts (texts equal ``pahole -F btf -C``; model facts equal DWARF's);
  d. nfs.ko: the methods of nfs_fh from its DWARF against its .BTF split on the
     vmlinux's (``ctracer functions nfs_fh --btf nfs.ko --btf-base vmlinux``), and a few
     nfs structs' layouts both ways against pahole;
  e. ``ctracer plan struct nfs_fh --binary nfs.ko`` (and ``--btf nfs.ko --btf-base
     vmlinux``) lists the probes it would place: an entry and an exit probe for every
     function discovery finds probeable, each a text symbol of nfs.ko (nm), and a reason
     for every function left out.

The package is fetched with ``apt-get download`` and extracted with ``dpkg-deb -x``
into the corpus directory unless already there (see corpus_files.py for where it looks).
ctracer's own cache (the DWARF catalog by build-id) is used as usual; --cold runs with
an empty one to time the first run.

    .venv/bin/python tests/corpus/check_corpus.py [--corpus-dir DIR] [--sample N]
                                                   [--seed N] [--cold] [--no-download]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import corpus_files
import corpus_layouts as layouts
import corpus_methods as methods
import corpus_oracles as oracles
from corpus_report import Findings, Timings

VMLINUX_STRUCTS = ("sock", "sk_buff")
MODULE_STRUCT = "nfs_fh"
#: parsed_partitions: an anonymous struct behind a pointer (`struct { ... } * parts;`)
ALWAYS_SAMPLED = ("sock", "sk_buff", "nfs_fh", "task_struct", "parsed_partitions") \
    + tuple(layouts.KNOWN_DWARF_GAPS)
MODULE_LAYOUTS = ("nfs_fh", "nfs_inode", "nfs_server", "nfs_client", "nfs_open_context")
CLI_CHECKED = ("sock", "sk_buff", "nfs_fh", "task_struct")
SAMPLE = 500
SEED = 20231


@dataclass
class Options:
    sample: int = SAMPLE
    seed: int = SEED
    jobs: int = 2           # external tools run at once (pfunct and pahole take ~3 GB each)


@dataclass
class Report:
    corpus: corpus_files.Corpus
    checks: list[Findings]
    timings: Timings
    wall: float
    peak_rss_mb: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def text(self) -> str:
        failed = [c.key for c in self.checks if not c.ok]
        parts = [f"corpus: {self.corpus.root} (release {self.corpus.release})",
                 f"  vmlinux: {self.corpus.vmlinux}", f"  nfs.ko:  {self.corpus.nfs_ko}", ""]
        parts += [c.text() + "\n" for c in self.checks]
        parts += ["time per stage (external tools ran beside ctracer, two at a time):",
                  self.timings.text(),
                  f"total wall {self.wall:.1f} s; peak RSS "
                  + ", ".join(f"{k} {v:.0f} MB" for k, v in self.peak_rss_mb.items()), "",
                  f"{len(self.checks) - len(failed)} of {len(self.checks)} checks passed"
                  + (f"; failed: {', '.join(failed)}" if failed else "")]
        return "\n".join(parts)


def _cli_output(argv: list[str]) -> tuple[int, str]:
    from ctracer import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = cli.main(argv)
    return status, out.getvalue()


def _dwarf_cache_state(path: Path) -> str:
    from ctracer.debuginfo import elf
    from ctracer.debuginfo.dwarf import cache
    key = cache.source_key(str(path), elf.build_id(str(path)))
    return "cached" if os.path.exists(cache.cache_path(key, "dwarf")) else "cold"


class CorpusRun:
    """One run of every check; ctracer works in this thread while the external tools
    run in a small pool beside it."""

    def __init__(self, corpus: corpus_files.Corpus, options: Options,
                 progress: Callable[[str], None]):
        self.corpus = corpus
        self.options = options
        self.timings = Timings()
        self.start = time.perf_counter()
        self._progress = progress
        self._btf_sizes: dict[str, dict[str, list[int]]] = {}

    def log(self, message: str) -> None:
        self._progress(f"[{time.perf_counter() - self.start:6.1f} s] {message}")

    def tool(self, label: str, future: Future):
        result = future.result()
        self.timings.add(label, result.seconds)
        self.log(f"{label}: done ({result.seconds:.1f} s)")
        return result

    def run(self) -> Report:
        c = self.corpus
        with ThreadPoolExecutor(self.options.jobs) as pool:
            pfunct = {s: pool.submit(oracles.pfunct_class, c.vmlinux, s) for s in VMLINUX_STRUCTS}
            pfunct[MODULE_STRUCT] = pool.submit(oracles.pfunct_class, c.nfs_ko, MODULE_STRUCT)
            symbols = {"vmlinux": pool.submit(oracles.function_symbols, c.vmlinux),
                       "nfs.ko": pool.submit(oracles.function_symbols, c.nfs_ko)}
            models = self.open_models()
            found = self.discover(models)
            sampled, module_names = self.choose_structs(models)
            pahole = {
                "vmlinux dwarf": pool.submit(oracles.pahole_layouts, c.vmlinux, sampled,
                                             "dwarf"),
                "vmlinux btf": pool.submit(oracles.pahole_layouts, c.vmlinux, sampled, "btf"),
                "nfs.ko dwarf": pool.submit(oracles.pahole_layouts, c.nfs_ko, module_names,
                                            "dwarf"),
                "nfs.ko btf": pool.submit(oracles.pahole_layouts, c.nfs_ko, module_names,
                                          "btf", c.vmlinux),
            }
            rendered = self.render(models, sampled, module_names)
            cli_findings = self.cli_paths(rendered, found)
            syms = {k: self.tool(f"nm {k}", f) for k, f in symbols.items()}
            check_a = self.check_pfunct(found, pfunct, syms)
            counts = {"vmlinux": len(sampled), "nfs.ko": len(module_names)}
            pahole_out = {k: self.tool(f"pahole -C, {k} ({counts[k.split()[0]]} structs)", f)
                          for k, f in pahole.items()}
        checks = [check_a,
                  self.check_layouts(rendered, pahole_out, cli_findings),
                  self.check_btf(found, rendered, pahole_out, syms),
                  self.check_module(found, rendered, pahole_out, syms, cli_findings),
                  self.check_plan(found, syms)]
        wall = time.perf_counter() - self.start
        rss = {"this process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "largest child (a tool or a scan worker)":
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
        return Report(c, checks, self.timings, wall, rss)

    def btf_sizes(self, where: str) -> Callable[[str], list[int]]:
        """Sizes of the BTF structs of a name in ``where`` ("vmlinux" or "nfs.ko"),
        from bpftool, asked once and only when needed."""
        def lookup(name: str) -> list[int]:
            if where not in self._btf_sizes:
                c = self.corpus
                result = (oracles.btf_struct_sizes(c.vmlinux) if where == "vmlinux"
                          else oracles.btf_struct_sizes(c.nfs_ko, base=c.vmlinux))
                self.timings.add(f"bpftool btf dump file {where}", result.seconds)
                self._btf_sizes[where] = result.sizes
            return self._btf_sizes[where].get(name, [])
        return lookup

    # -- ctracer's side

    def open_models(self) -> dict:
        from ctracer.debuginfo.btf import reader as btf
        from ctracer.debuginfo.dwarf import reader as dwarf
        c = self.corpus
        state = _dwarf_cache_state(c.vmlinux)
        models = {}
        with self.timings.measure(f"ctracer: DWARF catalog of vmlinux ({state})"):
            models["vmlinux dwarf"] = dwarf.open_elf_types(str(c.vmlinux))
            models["vmlinux dwarf"].catalog()
        self.log(f"vmlinux DWARF catalog ({state}) ready")
        with self.timings.measure("ctracer: .BTF of vmlinux opened, catalog"):
            models["vmlinux btf"] = btf.open_btf(str(c.vmlinux))
            models["vmlinux btf"].catalog()
        with self.timings.measure("ctracer: nfs.ko DWARF catalog, split .BTF"):
            models["nfs.ko dwarf"] = dwarf.open_elf_types(str(c.nfs_ko))
            models["nfs.ko dwarf"].catalog()
            models["nfs.ko btf"] = btf.open_btf(str(c.nfs_ko), base=models["vmlinux btf"])
            models["nfs.ko btf"].catalog()
        return models

    def discover(self, models: dict) -> dict:
        from ctracer.plan.discovery import discover
        found = {}
        for fmt in ("dwarf", "btf"):
            with self.timings.measure(f"ctracer: discovery of {', '.join(VMLINUX_STRUCTS)}, "
                                      f"{MODULE_STRUCT} ({fmt})"):
                for s in VMLINUX_STRUCTS:
                    found[(fmt, s)] = discover(models[f"vmlinux {fmt}"].catalog(), s)
                found[(fmt, MODULE_STRUCT)] = discover(models[f"nfs.ko {fmt}"].catalog(),
                                                       MODULE_STRUCT)
        return found

    def choose_structs(self, models: dict) -> tuple[list[str], list[str]]:
        """The sampled vmlinux structs and the nfs.ko ones, each in .debug_info order
        (how pahole wants a list)."""
        vd, nd = models["vmlinux dwarf"], models["nfs.ko dwarf"]
        sampled = layouts.sample_structs(vd.struct_names(), self.options.sample,
                                         self.options.seed, ALWAYS_SAMPLED)
        sampled.sort(key=vd.struct_location)
        module = [n for n in MODULE_LAYOUTS if nd.struct_location(n) is not None]
        module.sort(key=nd.struct_location)
        return sampled, module

    def render(self, models: dict, sampled: list[str], module_names: list[str]) -> dict:
        rendered = {}
        for key, names in (("vmlinux dwarf", sampled), ("vmlinux btf", sampled),
                           ("nfs.ko dwarf", module_names), ("nfs.ko btf", module_names)):
            with self.timings.measure(f"ctracer: find_struct + render, {key} "
                                      f"({len(names)} structs)"):
                rendered[key] = layouts.render_structs(models[key], names)
        self.log("layouts rendered")
        return rendered

    def cli_paths(self, rendered: dict, found: dict) -> dict[str, Findings]:
        """The commands themselves give what the in-process path gave."""
        c = self.corpus
        out = {"vmlinux": Findings("", "ctracer struct NAME --binary vmlinux, the command"),
               "nfs.ko": Findings("", "ctracer functions nfs_fh --btf nfs.ko --btf-base "
                                      "vmlinux, the command")}
        f = out["vmlinux"]
        with self.timings.measure(f"ctracer struct --binary vmlinux, {len(CLI_CHECKED)} runs"):
            for name in CLI_CHECKED:
                expected = rendered["vmlinux dwarf"].get(name)
                if expected is None or expected.text is None:
                    continue
                status, text = _cli_output(["struct", name, "--binary", str(c.vmlinux)])
                if status != 0 or text != expected.text:
                    f.fail(f"ctracer struct {name} (status {status}) differs from find_struct "
                           "+ layout.render")
        f.say(f"{', '.join(CLI_CHECKED)}: "
              + ("same text as the in-process path" if f.ok else "DIFFERENT"))
        f = out["nfs.ko"]
        with self.timings.measure("ctracer functions --btf nfs.ko --btf-base vmlinux --json"):
            status, text = _cli_output(["functions", MODULE_STRUCT, "--btf", str(c.nfs_ko),
                                        "--btf-base", str(c.vmlinux), "--json"])
        if status != 0:
            f.fail(f"exit status {status}")
        else:
            got = sorted((m["key"], m["reach"], m["via"]) for m in json.loads(text)["methods"])
            want = sorted((m.key, m.route_kind, m.route_text) for m in found[("btf", MODULE_STRUCT)].methods)
            f.say(f"{len(got)} methods, " + ("the same as in-process discovery"
                                             if got == want else "DIFFERENT"))
            if got != want:
                f.fail("the command's methods differ from discover() on the same BTF")
        return out

    # -- the checks

    def check_pfunct(self, found: dict, pfunct: dict, syms: dict) -> Findings:
        check = Findings("a", "methods include pfunct --class; every extra name explained")
        comparisons = {}
        for s, where in [(s, "vmlinux DWARF") for s in VMLINUX_STRUCTS] + [
                (MODULE_STRUCT, "nfs.ko DWARF")]:
            result = self.tool(f"pfunct -F dwarf --class={s} ({where.split()[0]})", pfunct[s])
            comparisons[s] = methods.compare_with_pfunct(found[("dwarf", s)], result.names,
                                                         where, result.seconds)
        for binary, group in ((self.corpus.vmlinux, VMLINUX_STRUCTS),
                              (self.corpus.nfs_ko, (MODULE_STRUCT,))):
            candidates = [m for s in group for m in comparisons[s].unit_candidates()]
            if not candidates:
                continue
            facts = oracles.unit_facts(binary, {m.name for m in candidates} | set(group))
            self.timings.add(f"llvm-dwarfdump --name, {binary.name} "
                             f"({len({m.name for m in candidates})} functions)", facts.seconds)
            for s in group:
                comparisons[s].settle_units(facts)
        for s in comparisons:
            where = "nfs.ko" if s == MODULE_STRUCT else "vmlinux"
            check.extend(methods.pfunct_findings(comparisons[s], syms[where]))
        return check

    def check_layouts(self, rendered: dict, pahole: dict, cli: dict) -> Findings:
        check = Findings("b", f"layouts of {len(rendered['vmlinux dwarf'])} vmlinux structs "
                              f"(seed {self.options.seed}) equal pahole -F dwarf -C")
        part = layouts.compare_with_pahole(rendered["vmlinux dwarf"], pahole["vmlinux dwarf"],
                                           "vmlinux DWARF", layouts.KNOWN_DWARF_GAPS)
        part.say(layouts.timing_line(rendered["vmlinux dwarf"]))
        check.extend(part)
        check.extend(cli["vmlinux"])
        return check

    def check_btf(self, found: dict, rendered: dict, pahole: dict, syms: dict) -> Findings:
        check = Findings("c", "vmlinux: its .BTF gives the methods and layouts its DWARF gives")
        for s in VMLINUX_STRUCTS:
            check.extend(methods.compare_dwarf_btf(found[("dwarf", s)], found[("btf", s)],
                                                   syms["vmlinux"], f"methods of struct {s}"))
        part = layouts.compare_with_pahole(rendered["vmlinux btf"], pahole["vmlinux btf"],
                                           "vmlinux .BTF layouts against pahole -F btf -C")
        part.say(layouts.timing_line(rendered["vmlinux btf"]))
        check.extend(part)
        check.extend(layouts.compare_formats(rendered["vmlinux dwarf"], rendered["vmlinux btf"],
                                             self.btf_sizes("vmlinux"),
                                             layouts.KNOWN_DWARF_GAPS))
        return check

    def check_module(self, found: dict, rendered: dict, pahole: dict, syms: dict,
                     cli: dict) -> Findings:
        check = Findings("d", "nfs.ko: DWARF against .BTF split on vmlinux's")
        check.extend(methods.compare_dwarf_btf(found[("dwarf", MODULE_STRUCT)],
                                               found[("btf", MODULE_STRUCT)], syms["nfs.ko"],
                                               f"methods of struct {MODULE_STRUCT}"))
        check.extend(cli["nfs.ko"])
        names = ", ".join(rendered["nfs.ko dwarf"])
        check.extend(layouts.compare_with_pahole(rendered["nfs.ko dwarf"],
                                                 pahole["nfs.ko dwarf"],
                                                 f"{names}: DWARF against pahole -F dwarf",
                                                 layouts.KNOWN_DWARF_GAPS))
        check.extend(layouts.compare_with_pahole(rendered["nfs.ko btf"], pahole["nfs.ko btf"],
                                                 f"{names}: split BTF against pahole -F btf "
                                                 "--btf_base"))
        check.extend(layouts.compare_formats(rendered["nfs.ko dwarf"], rendered["nfs.ko btf"],
                                             self.btf_sizes("nfs.ko"),
                                             layouts.KNOWN_DWARF_GAPS))
        return check

    def check_plan(self, found: dict, syms: dict) -> Findings:
        c = self.corpus
        check = Findings("e", f"ctracer plan struct {MODULE_STRUCT} on nfs.ko: the probes it "
                              "would place")
        for fmt, source in (("dwarf", ["--binary", str(c.nfs_ko)]),
                            ("btf", ["--btf", str(c.nfs_ko), "--btf-base", str(c.vmlinux)])):
            part = Findings("", f"ctracer plan struct {MODULE_STRUCT} "
                                f"{' '.join(source).replace(str(c.nfs_ko), 'nfs.ko').replace(str(c.vmlinux), 'vmlinux')}")
            with self.timings.measure(f"ctracer plan {MODULE_STRUCT} ({fmt})"):
                status, text = _cli_output(["plan", "struct", MODULE_STRUCT, *source, "--json"])
            if status != 0:
                part.fail(f"exit status {status}")
                check.extend(part)
                continue
            check_plan_json(json.loads(text), found[(fmt, MODULE_STRUCT)],
                            syms["nfs.ko"].by_name, part)
            check.extend(part)
        return check


def check_plan_json(doc: dict, found, symbols: dict, f: Findings) -> None:
    """A plan of a module's types (not the running kernel's) against its discovery and
    its symbol table."""
    probes = doc["probes"]
    if doc["kernel"].get("space") != "kernel" or doc["kernel"].get("running_kernel"):
        f.fail(f"planned as {doc['kernel'].get('space')} space, running kernel "
               f"{doc['kernel'].get('running_kernel')}")
    entry = {p["function"]: p["kind"] for p in probes if p["kind"] in ("fentry", "kprobe")}
    exits = {p["function"]: p["kind"] for p in probes if p["kind"] in ("fexit", "kretprobe")}
    left = {p["function"]: p["error"] for p in probes if p["kind"] is None}
    functions = {m.key: m for m in found.methods if not m.is_tracepoint}
    probeable = {k for k, m in functions.items() if all(
        x.probeable for x in found.methods if x.key == k)}
    glue = {k for k in probeable if functions[k].name.startswith(("__SCT__", "__bpf_trace_"))}
    # nm is the oracle of what exists out of line under its own name
    expected = {k for k in probeable - glue if functions[k].name in symbols}
    if set(entry) != expected:
        f.fail(f"functions with an entry probe differ from the probeable ones nm lists: "
               f"{sorted(set(entry) ^ expected)[:5]}")
    unnamed = probeable - glue - expected
    if not all(left.get(k, "").startswith(("left out: only a compiler clone exists",
                                           "left out: not in")) for k in unnamed):
        f.fail(f"functions without a symbol of their own not left out as such: {sorted(unnamed)[:5]}")
    if set(exits) != set(entry):
        f.fail("not every entry probe has its exit probe")
    if set(left) != set(functions) - set(entry):
        f.fail(f"left out functions not listed: {sorted(set(functions) - set(entry) - set(left))[:5]}")
    if not all(why and why.startswith("left out: ") for why in left.values()):
        f.fail("a function left out without a reason")
    absent = sorted(functions[k].name for k in entry if functions[k].name not in symbols)
    if absent:
        f.fail(f"{len(absent)} planned functions are no text symbol of nfs.ko: {absent[:5]}")
    kinds = sorted({p["kind"] for p in probes if p["kind"] and p["kind"] != "raw_tracepoint"})
    reasons = sorted({why for why in left.values()})
    f.say(f"{len(probes)} probes: {len(entry)} functions with entry and exit probes "
          f"({', '.join(kinds)}), each a text symbol of nfs.ko; {len(left)} left out, "
          f"{len(unnamed)} of them for having no symbol of their own (nm)"
          + (f" ({'; '.join(r[len('left out: '):] for r in reasons[:3])})" if reasons else ""))
    tps = [p for p in probes if p["kind"] == "raw_tracepoint"]
    if tps:
        f.say(f"{len(tps)} raw tracepoints: {', '.join(p['function'] for p in tps[:5])}")


def run_checks(corpus: corpus_files.Corpus, options: Optional[Options] = None,
               progress: Callable[[str], None] = lambda _m: None) -> Report:
    return CorpusRun(corpus, options or Options(), progress).run()


def _arguments(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.rsplit("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", type=Path, metavar="DIR",
                   help="where the package is (or goes): the extracted tree or the directory "
                        f"holding it as x/ (default: ${corpus_files.ENV}, else "
                        f"{corpus_files.default_corpus_dir()}, else {corpus_files.SHARED_TREE})")
    p.add_argument("--package", default=corpus_files.PACKAGE, help=argparse.SUPPRESS)
    p.add_argument("--no-download", action="store_true",
                   help="fail instead of fetching the package when it is not there")
    p.add_argument("--sample", type=int, default=SAMPLE, metavar="N",
                   help=f"structs sampled for the layout checks (default {SAMPLE})")
    p.add_argument("--seed", type=int, default=SEED, help=f"sampling seed (default {SEED})")
    p.add_argument("--cold", action="store_true",
                   help="use an empty ctracer cache (times the first run)")
    p.add_argument("--jobs", type=int, default=2, metavar="N",
                   help="external tools run at once (default 2; ~3 GB each)")
    args = p.parse_args(argv)
    if args.sample < 0 or args.jobs < 1:
        p.error("--sample must be 0 or more and --jobs 1 or more")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = _arguments(argv)
    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)
    try:
        corpus = corpus_files.corpus_for_run(args.corpus_dir, args.package,
                                             not args.no_download, progress)
    except corpus_files.CorpusError as e:
        print(f"check_corpus: {e}", file=sys.stderr)
        return 2
    missing = oracles.missing_tools()
    if missing:
        print(f"check_corpus: missing {', '.join(missing)} (scripts/setup.sh installs them)",
              file=sys.stderr)
        return 2
    options = Options(args.sample, args.seed, args.jobs)
    with tempfile.TemporaryDirectory(prefix="ctracer-cold-") as empty:
        if args.cold:
            os.environ["XDG_CACHE_HOME"] = empty
        try:
            report = run_checks(corpus, options, progress)
        except RuntimeError as e:  # a reference tool failed: nothing to compare with
            print(f"check_corpus: {e}", file=sys.stderr)
            return 2
    print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
