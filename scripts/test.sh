#!/usr/bin/env bash
# Runs every test: the C++ units (GoogleTest), then the Python suite (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
./build/cmake/poptorch_cpp_tests --gtest_brief=1
python -m pytest -q "$@"
