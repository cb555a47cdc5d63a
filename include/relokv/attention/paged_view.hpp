#pragma once
/// @file
/// The paged KV views now live in memory/paged_view.hpp (views of KV memory, below the
/// kernels); this header stays for code that includes it here.
#include "relokv/memory/paged_view.hpp"
