#pragma once
// Catch2 compatibility: the tests are written against the subset shared by v2.13 and v3.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;
#define RELOKV_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#define RELOKV_CATCH_V3 0
#endif
