#!/usr/bin/env bash
# Builds this folder's solution with the judge's builder (SKILL.md) and prints the compiler's
# errors, if any. Exit status 1 when it does not build.
cd "$(dirname "$0")" && exec python3 -c 'import sys; from judge import ask, print_compile; sys.exit(0 if print_compile(ask()) else 1)'
