// The single Catch2 v2 main shared by every test binary.
#define CATCH_CONFIG_MAIN
#include "support/catch.hpp"
