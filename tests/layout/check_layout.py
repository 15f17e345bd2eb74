#!/usr/bin/env python3
"""The layout as the docs say it is (ctest -R layout):

- docs/development.md's layout table names every folder under src/, apps/ and tests/
  (two levels down, those that hold tracked files), and every path it names exists;
- docs/architecture.md's line "Levels of src/, top to bottom: ..." names every folder of
  src/ (but models, a component above the library), and every quoted include of those
  folders goes to a file of the same level or a lower one;
- docs/architecture.md's table "| level | public headers |" gives each public header of
  include/torchattn/ (but models/ and the umbrella headers), by name or, in a subfolder,
  by its folder ("flex/") where it does not name it, the level that implements it,
  and every `#include <torchattn/...>` of src/ (but models) and of those headers goes to
  a header of the same level or a lower one;
- docs/architecture.md's line "Floors of src/models/, top to bottom: ..." names every
  folder of src/models/ (which holds no file outside them), and its table "| floor |
  public headers of the models component |" gives each header of include/torchattn/models/
  its floor: every quoted include of src/models/ goes to "models/<floor>/..." of the same
  floor or a lower one (never to the library's private headers), and every
  `#include <torchattn/models/...>` of src/models/ and of those headers to a header of the
  same floor or a lower one;
- the public face holds no kernel code: no header of include/torchattn/ outside detail/
  holds an intrinsic, an x86 vector type, a `target` attribute or a compiler pragma, and
  the umbrella headers include no detail/ header;
- one file of src/backends/, selector.cpp (the table of paths), includes the attention
  kernels of src/kernels/: the others reach them through the table;
- the namespaces mirror the folders: a file of src/<level>/ opens `torchattn` or
  `torchattn::functional` (public names), or `torchattn::<level>` and namespaces
  below it for its internal ones; a file of src/models/<floor>/ `torchattn::models` or
  `torchattn::models::<floor>`; never a `detail` namespace above the kernels' own.

Usage: check_layout.py [REPO]
"""

import os
import re
import subprocess
import sys


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    os.chdir(repo)
    failures = []
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split()
    files = [f for f in files if os.path.exists(f)]
    folders = set()
    for f in files:
        parts = f.split("/")
        if parts[0] in ("src", "apps", "tests") and len(parts) > 1:
            for depth in (1, 2):
                if len(parts) > depth:
                    folders.add("/".join(parts[:depth]) + "/")

    # The layout table.
    text = open("docs/development.md").read()
    table = text[text.index("## Layout"):]
    named = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            named.update(re.findall(r"`([^`]+)`", first))
    for folder in sorted(folders):
        if folder not in named:
            failures.append(f"docs/development.md's layout table does not name {folder}")
    for path in sorted(named):
        if not os.path.exists(path):
            failures.append(f"docs/development.md's layout table names {path}, which does not exist")

    # The levels of src/.
    arch = open("docs/architecture.md").read()
    m = re.search(r"^Levels of src/, top to bottom: (.+)\.$", arch, re.M)
    if not m:
        failures.append("docs/architecture.md has no line 'Levels of src/, top to bottom: ...'")
        levels = {}
    else:
        groups = [re.findall(r"`([^`]+)`", g) for g in m.group(1).split(">")]
        levels = {name: len(groups) - i for i, g in enumerate(groups) for name in g}
    library = {f.split("/")[1] for f in files if f.startswith("src/") and f.count("/") >= 2} - {"models"}
    for folder in sorted(library - set(levels)):
        failures.append(f"docs/architecture.md's levels do not name src/{folder}/")
    for folder in sorted(set(levels) - library):
        failures.append(f"docs/architecture.md's levels name src/{folder}/, which holds no file")
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    arrows = 0
    for f in files:
        parts = f.split("/")
        if parts[0] != "src" or len(parts) < 3 or parts[1] not in levels:
            continue
        for target in include.findall(open(f).read()):
            top = target.split("/")[0]
            if "/" not in target or top not in levels:
                failures.append(f"{f} includes \"{target}\": name private headers from src/ (\"block/...\")")
                continue
            arrows += 1
            if levels[top] > levels[parts[1]]:
                failures.append(f"{f} ({parts[1]}) includes \"{target}\" ({top}), a higher level")
    # The face: the public headers by level.
    face = {}
    folder_face = {}  # a subfolder of include/torchattn/ named whole ("flex/"): its headers' level
    for row in re.findall(r"^\| `(\w+)` \| (.+) \|$", arch, re.M):
        for header in re.findall(r"`([^`]+\.h)`", row[1]):
            if header in face:
                failures.append(f"docs/architecture.md names the public header {header} twice")
            face[header] = row[0]
        for folder in re.findall(r"`([^`]+/)`", row[1]):
            if folder in folder_face:
                failures.append(f"docs/architecture.md names the header folder {folder} twice")
            folder_face[folder] = row[0]
    umbrella = {"torchattn.h", "models.h", "version.h"}
    public = {f[len("include/torchattn/"):] for f in files
              if f.startswith("include/torchattn/") and f.count("/") == 2 and f.endswith(".h")} - umbrella
    for header in sorted(public - set(face)):
        failures.append(f"docs/architecture.md's table of public headers does not name {header}")
    # Every header in a subfolder (but models/, the floors' below) at its folder's level.
    nested = {f[len("include/torchattn/"):] for f in files
              if f.startswith("include/torchattn/") and f.count("/") > 2 and f.endswith(".h")
              and not f.startswith("include/torchattn/models/")}
    for header in sorted(nested):
        folder = next((d for d in sorted(folder_face, key=len, reverse=True) if header.startswith(d)), None)
        if header in face:
            continue  # named on its own (a level other than its folder's)
        if folder is None:
            failures.append(f"docs/architecture.md's table of public headers names no folder of {header}")
        else:
            face[header] = folder_face[folder]
    for folder in sorted(folder_face):
        if not any(h.startswith(folder) for h in nested):
            failures.append(f"docs/architecture.md's table of public headers names {folder}, which holds no header")
    public |= nested
    for header in sorted(set(face) - public):
        failures.append(f"docs/architecture.md's table of public headers names {header}, which does not exist")
    for header, level in sorted(face.items()):
        if level not in levels:
            failures.append(f"docs/architecture.md puts {header} at level {level}, which is not a level")
    angle = re.compile(r'^\s*#\s*include\s+<torchattn/([^>]+)>', re.M)
    sources = [(f, f.split("/")[1]) for f in files
               if f.startswith("src/") and f.count("/") >= 2 and f.split("/")[1] in levels]
    sources += [(f"include/torchattn/{h}", face[h]) for h in sorted(public & set(face)) if face[h] in levels]
    for f, level in sources:
        for target in angle.findall(open(f).read()):
            if target in umbrella or target.startswith("models"):
                failures.append(f"{f} ({level}) includes <torchattn/{target}>, above the library's levels")
                continue
            if target not in face or face[target] not in levels:
                continue  # reported above
            arrows += 1
            if levels[face[target]] > levels[level]:
                failures.append(f"{f} ({level}) includes <torchattn/{target}> ({face[target]}), a higher level")

    face_checked = check_no_kernel_code(files, failures)
    check_one_selector(files, failures)
    floors, floor_arrows, floor_face = check_models_floors(arch, files, failures)
    spaces = check_namespaces(set(levels), files, failures)

    for line in failures:
        print(f"[layout] FAIL {line}")
    print(f"layout: {len(folders)} folders against the table, {arrows} includes of src/ and of "
          f"{len(face)} public headers against {len(levels)} levels; {floor_arrows} includes of src/models/ and of "
          f"{floor_face} of its public headers against {floors} floors; {spaces} namespaces opened in src/ "
          f"against their folders; {face_checked} public headers outside detail/ free of kernel code")
    print(f"{1 if not failures else 0} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


# What only the kernels' headers (include/torchattn/detail/) may hold: intrinsics and
# their headers, x86 vector types, target attributes and compiler pragmas.
KERNEL_CODE = re.compile(r"(<[a-z0-9]*intrin\.h>|\b_mm(256|512)?_\w+\s*\(|\b__m(128|256|512)[id]?\b|"
                         r"__attribute__\s*\(\(\s*target|\[\[gnu::target|#\s*pragma\s+(GCC|clang)|"
                         r"_Pragma\s*\()")


def check_no_kernel_code(files, failures):
    """No kernel code in the public face outside detail/ (see the docstring); returns the headers checked."""
    headers = [f for f in files if f.startswith("include/torchattn/") and f.endswith(".h")
               and not f.startswith("include/torchattn/detail/")]
    for f in headers:
        for number, line in enumerate(open(f).read().splitlines(), 1):
            code = line.split("//")[0]
            m = KERNEL_CODE.search(code)
            if m:
                failures.append(f"{f}:{number} holds kernel code ({m.group(0).strip()}); it goes in "
                                "include/torchattn/detail/")
    for umbrella in ("include/torchattn/torchattn.h", "include/torchattn/models.h"):
        if umbrella in files:
            for target in re.findall(r'^\s*#\s*include\s+<torchattn/(detail/[^>]+)>', open(umbrella).read(), re.M):
                failures.append(f"{umbrella} includes <torchattn/{target}>: the umbrella headers include no "
                                "kernel code")
    return len(headers)


def check_one_selector(files, failures):
    """Only the table of paths includes the attention kernels within src/backends/ (see the docstring)."""
    for f in files:
        if not f.startswith("src/backends/") or f == "src/backends/selector.cpp":
            continue
        for target in re.findall(r'^\s*#\s*include\s+"(kernels/[^"]+)"', open(f).read(), re.M):
            failures.append(f"{f} includes \"{target}\": only src/backends/selector.cpp (the table of paths) "
                            "calls the kernels")


def check_models_floors(arch, files, failures):
    """The floors of src/models/ (see the docstring); returns (floors, includes, headers) checked."""
    m = re.search(r"^Floors of src/models/, top to bottom: (.+)\.$", arch, re.M)
    if not m:
        failures.append("docs/architecture.md has no line 'Floors of src/models/, top to bottom: ...'")
        return 0, 0, 0
    groups = [re.findall(r"`([^`]+)`", g) for g in m.group(1).split(">")]
    floors = {name: len(groups) - i for i, g in enumerate(groups) for name in g}
    models = [f for f in files if f.startswith("src/models/")]
    for f in models:
        if f.count("/") < 3:
            failures.append(f"{f} lies in src/models/ outside a floor's folder")
    present = {f.split("/")[2] for f in models if f.count("/") >= 3}
    for folder in sorted(present - set(floors)):
        failures.append(f"docs/architecture.md's floors do not name src/models/{folder}/")
    for folder in sorted(set(floors) - present):
        failures.append(f"docs/architecture.md's floors name src/models/{folder}/, which holds no file")
    face = {}
    for floor, row in re.findall(r"^\| `models/(\w+)` \| (.+) \|$", arch, re.M):
        if floor not in floors:
            failures.append(f"docs/architecture.md puts public headers at models/{floor}, which is not a floor")
        for header in re.findall(r"`([^`]+\.h)`", row):
            if header in face:
                failures.append(f"docs/architecture.md names the public header models/{header} twice")
            face[header] = floor
    public = {f[len("include/torchattn/models/"):] for f in files
              if f.startswith("include/torchattn/models/") and f.count("/") == 3 and f.endswith(".h")}
    for header in sorted(public - set(face)):
        failures.append(f"docs/architecture.md's table of the models' public headers does not name {header}")
    for header in sorted(set(face) - public):
        failures.append(f"docs/architecture.md's table of the models' public headers names {header}, "
                        "which does not exist")
    quoted = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    angle = re.compile(r'^\s*#\s*include\s+<torchattn/models/([^>]+)>', re.M)
    sources = [(f, f.split("/")[2]) for f in models if f.count("/") >= 3 and f.split("/")[2] in floors]
    arrows = 0
    for f, floor in sources:
        for target in quoted.findall(open(f).read()):
            parts = target.split("/")
            if len(parts) < 3 or parts[0] != "models" or parts[1] not in floors:
                failures.append(f"{f} includes \"{target}\": the models include their own private headers "
                                "as \"models/<floor>/...\", and only the library's public ones")
                continue
            arrows += 1
            if floors[parts[1]] > floors[floor]:
                failures.append(f"{f} ({floor}) includes \"{target}\" ({parts[1]}), a higher floor")
    sources += [(f"include/torchattn/models/{h}", face[h]) for h in sorted(public & set(face)) if face[h] in floors]
    for f, floor in sources:
        for target in angle.findall(open(f).read()):
            if target not in face or face[target] not in floors:
                continue  # reported above
            arrows += 1
            if floors[face[target]] > floors[floor]:
                failures.append(f"{f} ({floor}) includes <torchattn/models/{target}> ({face[target]}), a higher floor")
    return len(floors), arrows, len(face)


def check_namespaces(levels, files, failures):
    opened = re.compile(r"^\s*namespace\s+([\w:]+)\s*\{", re.M)
    count = 0
    for f in files:
        parts = f.split("/")
        if parts[0] != "src" or len(parts) < 3 or not f.endswith((".h", ".cpp", ".cu", ".cuh")):
            continue
        if parts[1] == "models":
            if len(parts) < 4:
                continue
            own = f"torchattn::models::{parts[2]}"
            allowed = {"torchattn::models"}
        else:
            own = f"torchattn::{parts[1]}"
            allowed = {"torchattn", "torchattn::functional"}
        for name in opened.findall(open(f).read()):
            count += 1
            if name.startswith("torchattn"):
                if name not in allowed and name != own and not name.startswith(own + "::"):
                    failures.append(f"{f} opens namespace {name}; internal names of src/{'/'.join(parts[1:-1])}/ "
                                    f"go in {own}")
            elif name == "detail" and parts[1] != "kernels":
                failures.append(f"{f} opens a namespace detail; internal names go in {own}")
            elif name in levels and name != parts[1]:
                failures.append(f"{f} opens namespace {name}, another level's")
    return count


if __name__ == "__main__":
    sys.exit(main())
