#!/usr/bin/env bash
# `make lint` and `make lint-changed`: the pinned clang-tidy (tools/requirements.txt, in
# .venv) with the repository's .clang-tidy, through the wheel's run-clang-tidy.py, JOBS
# files at a time. It reads LINT_BUILD/compile_commands.json, which `make lint-configure`
# writes (a configure-only folder without the unity build, so that each source has its
# own entry; nothing is compiled). LINT_PATHS (default: src, the libraries) names the
# folders whose sources are linted; `LINT_PATHS="src apps"` adds the programs (their
# sources include <torch/torch.h>: several times the time of a library source).
#   tools/lint.sh all      every source under LINT_PATHS
#   tools/lint.sh changed  the sources under LINT_PATHS that a change touches:
#     - the change: from `git merge-base HEAD origin/main` to the working tree; where
#       that is HEAD itself (a fresh clone of main, as CI has), the last commit
#       (HEAD~1..HEAD);
#     - a changed .cpp is linted itself; a changed header (include/ or LINT_PATHS)
#       through the sources that include it directly (its diagnostics come out through
#       them: HeaderFilterRegex); a header that no source includes directly is left to
#       `make lint`;
#     - LINT_MAX > 0 lints at most that many (changed .cpp files first) and names the
#       rest, left to `make lint`; CI sets it to bound its time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${LINT_BUILD:-build-lint}
jobs=${JOBS:-2}
read -r -a paths <<<"${LINT_PATHS:-src}"
db="$build/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "tools/lint.sh: no $db (make lint-configure writes it)"
  exit 1
fi
# -fno-openmp: the wheel has no omp.h, which LibTorch's ATen/ParallelOpenMP.h includes
# under -fopenmp (GCC's flags in the compile commands); torchattn's code has no OpenMP
# of its own to analyse.
run=(.venv/bin/python .venv/bin/run-clang-tidy.py -clang-tidy-binary .venv/bin/clang-tidy -p "$build"
     -j "$jobs" -quiet -hide-progress -extra-arg=-fno-openmp)
escape() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g'; }
in_db() { grep -qF "\"file\": \"$root/$1\"" "$db"; }

if [ "${1:-}" = "all" ]; then
  regexes=()
  count=0
  for p in "${paths[@]}"; do
    regexes+=("^$(escape "$root/$p")/.*\.(cpp|cc)$")
    count=$((count + $(grep -cF "\"file\": \"$root/$p/" "$db" || true)))
  done
  echo "lint: clang-tidy on the $count sources of ${paths[*]}, $jobs at a time"
  exec "${run[@]}" "${regexes[@]}"
fi
if [ "${1:-}" != "changed" ]; then
  echo "usage: tools/lint.sh all|changed"
  exit 2
fi

head=$(git rev-parse HEAD)
base=""
if git rev-parse -q --verify origin/main >/dev/null; then
  base=$(git merge-base HEAD origin/main || true)
fi
if [ -z "$base" ] || [ "$base" = "$head" ]; then
  if ! git rev-parse -q --verify HEAD~1 >/dev/null; then
    echo "lint-changed: HEAD has no parent here (a shallow clone?): nothing to compare with; make lint checks all"
    exit 0
  fi
  base=$(git rev-parse HEAD~1)
fi
mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" -- include "${paths[@]}")

sources=()
add() {
  local f
  for f in "$@"; do
    [[ " ${sources[*]} " == *" $f "* ]] || sources+=("$f")
  done
}
source_globs=()
for p in "${paths[@]}"; do source_globs+=("$p/*.cpp" "$p/*.cc"); done
for f in "${changed[@]}"; do
  case "$f" in
    *.cpp | *.cc) [[ "$f" != include/* ]] && in_db "$f" && add "$f" ;;
  esac
done
for f in "${changed[@]}"; do
  case "$f" in
    include/*.h) name=${f#include/} ;;                  # <torchattn/kv_cache.h>
    src/*.h | src/*.inc) name=${f#src/} ;;               # "cache/append_watch.h"
    apps/*.h | tests/*.h) name=$(basename "$f") ;;       # "openai_api.h", "fmt.h"
    *) continue ;;
  esac
  mapfile -t users < <(git grep -lE "^#include [<\"]$(escape "$name")[>\"]" -- "${source_globs[@]}" || true)
  for u in "${users[@]}"; do
    in_db "$u" && add "$u"
  done
done

echo "lint-changed: ${#changed[@]} files changed under include/ ${paths[*]} since ${base:0:12}; ${#sources[@]} sources to lint"
if ((${#sources[@]} == 0)); then
  exit 0
fi
max=${LINT_MAX:-0}
if ((max > 0 && ${#sources[@]} > max)); then
  echo "lint-changed: LINT_MAX=$max: these $((${#sources[@]} - max)) are left to make lint:"
  printf '  %s\n' "${sources[@]:max}"
  sources=("${sources[@]:0:max}")
fi
printf '  %s\n' "${sources[@]}"
regexes=()
for f in "${sources[@]}"; do
  regexes+=("^$(escape "$root/$f")$")
done
exec "${run[@]}" "${regexes[@]}"
