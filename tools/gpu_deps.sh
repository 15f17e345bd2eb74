#!/usr/bin/env bash
# Stages what a bare GPU machine (no package registry) lacks to build and test
# torchattn, copied from this machine's Debian packages (tools/setup.sh installs them)
# into .gpu-deps/usr, laid out as Debian installs them; git ignores it. Headers and
# static libraries only, so nothing needs the shared libraries at run time:
#   GoogleTest, CLI11, Gloo's headers (train_gpt), nlohmann/json (the
#   safetensors reader), ICU's headers, libicuuc.a and libicudata.a
#   (torchattn_generate's tokenizer; the static libicuuc refers to the data library,
#   which CMakeLists.txt then links too), the fortunes text.
# Then: make test-gpu GPU_DEPS=.gpu-deps (tools/test_gpu.sh also finds .gpu-deps by itself).
# About 45 MB (30 of them ICU's data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh >/dev/null
lib=/usr/lib/x86_64-linux-gnu
for f in /usr/include/gtest /usr/include/CLI /usr/include/gloo /usr/include/nlohmann /usr/include/unicode \
         $lib/cmake/GTest /usr/share/cmake/CLI11 $lib/libicuuc.a $lib/libicudata.a /usr/share/games/fortunes; do
  [ -e "$f" ] || { echo "gpu_deps: $f is missing (tools/setup.sh installs it)" >&2; exit 1; }
done
rm -rf .gpu-deps
d=.gpu-deps/usr
mkdir -p $d/include $d/lib/x86_64-linux-gnu/cmake $d/share/cmake $d/share/games
cp -r /usr/include/gtest /usr/include/CLI /usr/include/gloo /usr/include/nlohmann /usr/include/unicode $d/include/
cp $lib/libgtest*.a $lib/libicuuc.a $lib/libicudata.a $d/lib/x86_64-linux-gnu/
cp -r $lib/cmake/GTest $d/lib/x86_64-linux-gnu/cmake/
[ -d $lib/cmake/nlohmann_json ] && cp -r $lib/cmake/nlohmann_json $d/lib/x86_64-linux-gnu/cmake/
[ -d /usr/share/cmake/nlohmann_json ] && cp -r /usr/share/cmake/nlohmann_json $d/share/cmake/
cp -r /usr/share/cmake/CLI11 $d/share/cmake/
cp -r /usr/share/games/fortunes $d/share/games/
echo "gpu_deps: staged $(du -sh .gpu-deps | cut -f1) in .gpu-deps/usr (git ignores it; name it in the device tool's carry)"
