#!/usr/bin/env python3
"""The benchmark figures that docs/*.md and README.md quote, taken from the results
pages (apps/bench/results/*.md) instead of copied by hand.

A quoted figure is marked with a name, and FIGURES below says where the name is found:

    ... 254.2 against <!-- fig:embed.b1.st -->124.7<!-- /fig --> sentences/s ...

    <!-- fig:generate.table -->

    | measure | torchattn | transformers |
    ...

    <!-- /fig -->

A name is one of
- Cell(page, row, column, section): a table cell, found by its row's first cell and its
  column's header (in the `## section` whose heading starts with `section`, where the
  page has several tables with that row and column); `fmt` rounds it ("{:.0f}");
- Text(page, regex): the one group of a regex that matches the page's prose exactly once;
- Table(page, header, section): a whole table, found by its first header cell.
A label that is no longer on the page, or that is found twice, is an error: figures are
never taken from a guess.

    python3 tools/docs_figures.py            # rewrite the marked figures (apps/bench/run.sh does)
    python3 tools/docs_figures.py --check    # exit 1 listing every figure that differs (ctest -R docs_figures)

Options: --root REPO (default: this script's repository), --results DIR (default
REPO/apps/bench/results).
"""

import argparse
import glob
import os
import re
import sys
from dataclasses import dataclass


@dataclass
class Cell:
    page: str
    row: str
    column: str
    section: str = ""
    fmt: str = ""


@dataclass
class Text:
    page: str
    regex: str
    fmt: str = ""


@dataclass
class Table:
    page: str
    header: str
    section: str = ""


FIGURES = {
    # benchmarks.md: the attention module against the Reference, LibTorch's and Python's.
    "bench.machine": Text("benchmarks.md", r"^- machine: (.+)$"),
    "bench.date": Text("benchmarks.md", r"^- torch .*, (\d{4}-\d\d-\d\d)$"),
    "bench.fwd.auto.speedup": Cell("benchmarks.md", "auto", "speed-up vs reference", "Forward,"),
    "bench.fwd.auto.ms": Cell("benchmarks.md", "auto", "median ms", "Forward,"),
    "bench.fwd.hand.ms": Cell("benchmarks.md", "linear+aten_sdpa", "median ms", "Forward,"),
    "bench.fwd.hand.ratio": Cell("benchmarks.md",
                                 "default inference forward <= 1.0x Linear + ATen SDPA by hand (time ratio)",
                                 "measured"),
    "bench.fwdbwd.auto.speedup": Cell("benchmarks.md", "auto", "speed-up vs reference", "Forward + backward"),
    "bench.long.rss": Cell("benchmarks.md", "B=1, T=16384 forward peak RSS growth < 1024 MiB", "measured",
                           fmt="{:.0f}"),
    "bench.decode.cache": Cell("benchmarks.md", "KV cache (forward_cached)", "tokens/s"),
    "bench.decode.recompute": Cell("benchmarks.md", "full forward each step", "tokens/s"),
    "bench.decode.ratio": Cell("benchmarks.md", "decode with cache >= 10x recompute", "measured", fmt="{:.0f}"),
    "bench.gqa.tokens": Cell("benchmarks.md", "gqa_4to1", "tokens/s"),
    "bench.mha.tokens": Cell("benchmarks.md", "mha", "tokens/s"),
    "bench.gqa.kv": Cell("benchmarks.md", "gqa_4to1", "KV cache MiB"),
    "bench.mha.kv": Cell("benchmarks.md", "mha", "KV cache MiB"),
    "bench.rope.without": Cell("benchmarks.md", "without RoPE", "median ms"),
    "bench.rope.with": Cell("benchmarks.md", "with RoPE", "median ms"),
    "bench.rope.ratio": Cell("benchmarks.md", "RoPE adds <= 10% to the forward (time ratio)", "measured"),
    "bench.softcap.ratio": Cell("benchmarks.md", "softcap", "x without"),
    "bench.sinks.ratio": Cell("benchmarks.md", "sinks", "x without"),
    "bench.softcap.rss": Cell("benchmarks.md", "softcap", "T=16384: peak MiB"),
    "bench.sinks.rss": Cell("benchmarks.md", "sinks", "T=16384: peak MiB"),
    # embed.md: SentenceEncoder against sentence-transformers.
    "embed.b1.torchattn": Cell("embed.md", "batch 1", "torchattn"),
    "embed.b1.st": Cell("embed.md", "batch 1", "sentence-transformers"),
    "embed.b1.ratio": Cell("embed.md", "batch 1", "ratio"),
    "embed.b1.met": Cell("embed.md", "batch 1 >= 2x sentence-transformers", "met"),
    "embed.b32.torchattn": Cell("embed.md", "batch 32", "torchattn"),
    "embed.b32.st": Cell("embed.md", "batch 32", "sentence-transformers"),
    "embed.b32.ratio": Cell("embed.md", "batch 32", "ratio"),
    "embed.b32.met": Cell("embed.md", "batch 32 >= 1.0x sentence-transformers", "met"),
    "embed.b1.unpacked": Text("embed.md", r"the same run without: batch 1 ([\d.]+) sentences/s"),
    "embed.b1.linear_ms": Text("embed.md", r"linear layers alone \(.*?\) take ([\d.]+) ms"),
    "embed.b1.allowed_ms": Text("embed.md", r"twice sentence-transformers' speed means ([\d.]+) ms per sentence"),
    "embed.b1.torchattn_ms": Text("embed.md", r"torchattn takes ([\d.]+) ms"),
    # weights.md: the weight formats beside CTranslate2, and their perplexity.
    "weights.table": Table("weights.md", "runtime, weights"),
    "weights.perplexity": Table("weights.md", "weights", "Perplexity"),
    "weights.targets": Table("weights.md", "target", "Targets"),
    # weights-zen3.md: the weights page kept from a CPU without AVX-512 or VNNI.
    "weights_zen3.targets": Table("weights-zen3.md", "target", "Targets"),
    "scale.table": Table("scale.md", "runtime, weights"),
    "scale.targets": Table("scale.md", "target", "Targets"),
    # quant.md: four-bit weights on the same model beside llama.cpp's Q4_0 and Q4_K_M.
    "quant.table": Table("quant.md", "runtime, weights"),
    "quant.targets": Table("quant.md", "target", "Targets"),
    # scale-zen3.md: the scale page kept from a CPU without AVX-512 or VNNI.
    "scale_zen3.targets": Table("scale-zen3.md", "target", "Targets"),
    "weights.bandwidth": Text("weights.md", r"^The memory read bandwidth measured by the best int8 run \(2 threads\), "
                                            r"([\d.]+) GB/s"),
    "weights.bound_share": Text("weights.md", r"int8 decodes at (\d+)% of it\.$"),
    "weights.int8.decode": Text("weights.md", r"^\| torchattn int8 \| 2 \| ([\d.]+) \|"),
    # packed.md: packed documents against padding, one long sequence and checkpointing.
    "packed.module": Table("packed.md", "configuration"),
    "packed.train": Table("packed.md", "train_gpt", "Training"),
    "packed.checkpointing": Table("packed.md", "activations", "Training"),
    "packed.targets": Table("packed.md", "target", "Targets"),
    # generate.md: SmolLM2-135M against transformers' generate.
    "generate.table": Table("generate.md", "measure"),
    "generate.targets": Table("generate.md", "target", "Targets"),
    "generate.decode.torchattn": Cell("generate.md", "decoding, tokens/s (after a 32-token prompt, 128 new)",
                                      "torchattn"),
    "generate.decode.transformers": Cell("generate.md", "decoding, tokens/s (after a 32-token prompt, 128 new)",
                                         "transformers"),
    "generate.prefill.torchattn": Cell("generate.md", "prefill of 512 tokens, s (warm)", "torchattn"),
    "generate.prefill.transformers": Cell("generate.md", "prefill of 512 tokens, s (warm)", "transformers"),
    "generate.bound": Text("generate.md", r"bounds decoding at ([\d.]+) tokens/s"),
    "generate.bound.torchattn": Text("generate.md", r"torchattn decodes at (\d+%) of that bound"),
    "generate.bound.transformers": Text("generate.md", r"of that bound, transformers at (\d+%)"),
    # serve.md: torchattn_serve against transformers' batched generate.
    "serve.machine": Text("serve.md", r"^- machine: (.+)$"),
    "serve.date": Text("serve.md", r"^- torch .*, (\d{4}-\d\d-\d\d)$"),
    "serve.c16.tokens": Cell("serve.md", "16", "tokens/s"),
    "serve.c16.x1": Cell("serve.md", "16", "x 1 client"),
    "serve.c16.ratio": Cell("serve.md", "batch 16", "ratio"),
    "serve.c1.tpot": Cell("serve.md", "1", "TPOT median ms", fmt="{:.0f}"),
    "serve.reused": Text("serve.md", r"the prefix cache gave (\d+) prompt tokens"),
    "serve.nocache.tokens": Text("serve.md", r"the same run made ([\d.]+) tokens/s"),
    "serve.nocache.ratio": Text("serve.md", r"the same run made [\d.]+ tokens/s \(([\d.]+x) transformers"),
    "serve.long.prompt": Text("serve.md", r"while a (\d+)-token prompt arrives", fmt="{:,.0f}"),
    "serve.long.tpot_ratio": Text("serve.md", r"([\d.]+x) the single-client median"),
    "serve.weights": Text("serve.md", r"lm_head included: (\d+) MiB of float32 weights"),
    # test-gpu.md and benchmarks-cuda.md: `make test-gpu` and `make bench DEVICE=cuda` on a GPU.
    "gpu.machine": Text("test-gpu.md", r"^- GPU: (.+)$"),
    "gpu.date": Text("test-gpu.md", r"^- date: (\d{4}-\d\d-\d\d)$"),
    "gpu.stages": Table("test-gpu.md", "stage", "Stages"),
    "gpu.training": Table("test-gpu.md", "figure", "Training"),
    "gpu.speed": Text("test-gpu.md", r"^    speed: (torchattn_generate .*)$"),
    "gpu.targets": Table("benchmarks-cuda.md", "target", "Targets"),
}


def tables(text):
    """(section heading, header cells, rows of cells, lines) of each table of a page."""
    section, out, lines = "", [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("#"):
            section = lines[i].lstrip("#").strip()
        if lines[i].startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            block = lines[i:j]
            cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in block]
            out.append((section, cells[0], cells[2:], block))
            i = j
            continue
        i += 1
    return out


def plain(cell):
    return cell.replace("**", "").replace("`", "").strip()


def resolve(fig, pages):
    """The figure's text on its page, or raises ValueError saying why not."""
    if fig.page not in pages:
        raise ValueError(f"no results page {fig.page}")
    text = pages[fig.page]
    if isinstance(fig, Text):
        found = re.findall(fig.regex, text, re.M)
        if len(found) != 1:
            raise ValueError(f"{fig.page}: /{fig.regex}/ matches {len(found)} times, not once")
        value = found[0]
    elif isinstance(fig, Cell):
        found = []
        for section, header, rows, _ in tables(text):
            if not section.startswith(fig.section):
                continue
            header = [plain(h) for h in header]
            if fig.column not in header:
                continue
            col = header.index(fig.column)
            found += [row[col] for row in rows if row and plain(row[0]) == fig.row and col < len(row)]
        if len(found) != 1:
            where = f" in section '{fig.section}...'" if fig.section else ""
            raise ValueError(f"{fig.page}: row '{fig.row}', column '{fig.column}'{where} found {len(found)} "
                             "times, not once")
        value = found[0]
    else:
        found = [block for section, header, _, block in tables(text)
                 if section.startswith(fig.section) and plain(header[0]) == fig.header]
        if len(found) != 1:
            raise ValueError(f"{fig.page}: table '{fig.header}' found {len(found)} times, not once")
        return "\n\n" + "\n".join(found[0]) + "\n\n"  # blank lines: the markers stay out of the table
    if fig.fmt:
        value = fig.fmt.format(float(value))
    return value


MARK = re.compile(r"<!-- fig:([\w.]+) -->(.*?)<!-- /fig -->", re.S)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 listing what differs")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--results", help="the results pages (default ROOT/apps/bench/results)")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    results = a.results or os.path.join(root, "apps", "bench", "results")
    pages = {os.path.basename(p): open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(results, "*.md"))}
    docs = sorted(glob.glob(os.path.join(root, "docs", "*.md"))) + [os.path.join(root, "README.md")]

    errors, differ, used, marked, changed = [], [], set(), 0, []
    values = {}
    for name, fig in FIGURES.items():
        try:
            values[name] = resolve(fig, pages)
        except ValueError as e:
            values[name] = None
            errors.append(f"fig:{name}: {e}")
    for path in docs:
        rel = os.path.relpath(path, root)
        text = open(path, encoding="utf-8").read()

        def fill(m):
            nonlocal marked
            name, old = m.group(1), m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            used.add(name)
            marked += 1
            if name not in FIGURES:
                errors.append(f"{rel}:{line}: fig:{name} is not a name of tools/docs_figures.py's FIGURES")
                return m.group(0)
            new = values[name]
            if new is None or new == old:
                return m.group(0)
            if "\n" in old.strip() and not new.startswith("\n"):
                errors.append(f"{rel}:{line}: fig:{name} spans lines, but is one figure")
                return m.group(0)
            if "\n" in new.strip():  # a table: its first row that differs
                rows = [(o, n) for o, n in zip(old.strip().splitlines() + [""] * 99, new.strip().splitlines())
                        if o != n]
                old, new = rows[0] if rows else (old, new)
            differ.append(f"{rel}:{line}: fig:{name} is '{old.strip()}', {FIGURES[name].page} says '{new.strip()}'")
            return f"<!-- fig:{name} -->{values[name]}<!-- /fig -->"

        new_text = MARK.sub(fill, text)
        if new_text != text and not a.check:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new_text)
            changed.append(rel)
    for name in FIGURES:
        if name not in used:
            errors.append(f"fig:{name} is defined but marked nowhere in docs/*.md or README.md")

    for line in errors:
        print(f"[docs_figures] ERROR {line}")
    for line in differ:
        print(f"[docs_figures] {'DIFFERS' if a.check else 'updated'} {line}")
    print(f"docs_figures: {marked} marked figures, {len(FIGURES)} names, {len(pages)} results pages; "
          f"{len(differ)} {'differ' if a.check else 'rewritten'}"
          + (f" in {', '.join(changed)}" if changed else "") + f", {len(errors)} errors")
    return 1 if errors or (a.check and differ) else 0


if __name__ == "__main__":
    sys.exit(main())
