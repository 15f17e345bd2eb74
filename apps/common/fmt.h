#pragma once

// The apps' formatted output: fmt, header-only, from the copy that ships inside
// LibTorch (torch/include/fmt). Debian's libfmt is not used: two fmt builds in one
// program clash. The apps' CMake target torchattn_apps_fmt defines FMT_HEADER_ONLY.

#ifndef FMT_HEADER_ONLY
#error "torchattn's apps use fmt header-only: link the torchattn_apps_fmt target (it defines FMT_HEADER_ONLY)"
#endif

#include <fmt/format.h>
#include <fmt/ostream.h>

#if !defined(FMT_VERSION) || FMT_VERSION < 100000
#error "torchattn's apps need fmt 10 or newer (LibTorch 2.x ships it in torch/include/fmt)"
#endif
