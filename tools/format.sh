#!/usr/bin/env bash
# `make format` and `make format-check`: the pinned clang-format (tools/requirements.txt,
# in .venv) with the repository's .clang-format, over the project's C++ files: those of
# src/, include/, apps/ and tests/ (.h .hpp .cpp .cc .cu .cuh .inc) that git tracks or
# that are new and not ignored (build folders, .venv and the like are not looked at).
#   tools/format.sh          formats them in place
#   tools/format.sh --check  changes nothing: prints the diff of each file that is not
#                            formatted (FORMAT_DIFF_LINES lines in all, default 300),
#                            then their names, and fails if there is any
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-.venv/bin/clang-format}
if [ ! -x "$clang_format" ]; then
  echo "tools/format.sh: no $clang_format (tools/setup.sh installs it into .venv)"
  exit 1
fi
files=()
while IFS= read -r f; do
  [ -f "$f" ] && files+=("$f")
done < <(git ls-files --cached --others --exclude-standard -- src include apps tests |
         grep -E '\.(h|hpp|cpp|cc|cu|cuh|inc)$' | sort -u)

if ((${#files[@]} == 0)); then
  echo "tools/format.sh: no C++ files found"
  exit 1
fi
if [ "${1:-}" != "--check" ]; then
  printf '%s\0' "${files[@]}" | xargs -0 "$clang_format" -i --style=file
  echo "format: ${#files[@]} files formatted with $("$clang_format" --version | sed 's/.*version //')"
  exit 0
fi

# One clang-format run names the files that differ (--dry-run: a warning per place);
# then the diff of each of those.
mapfile -t bad < <("$clang_format" --style=file --dry-run "${files[@]}" 2>&1 |
                   sed -nE 's/^(.+):[0-9]+:[0-9]+: (warning|error): .*/\1/p' | sort -u)
diffs=$(mktemp)
trap 'rm -f "$diffs"' EXIT
for f in "${bad[@]}"; do
  "$clang_format" --style=file "$f" | diff -u --label "$f" --label "$f (formatted)" "$f" - >>"$diffs" || true
done
if ((${#bad[@]})); then
  head -n "${FORMAT_DIFF_LINES:-300}" "$diffs"
  echo
  echo "format-check: ${#bad[@]} of ${#files[@]} files are not formatted (make format formats them):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format-check: ${#files[@]} files formatted"
