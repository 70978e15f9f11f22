"""Builds this folder's solution and checks it on fresh random inputs (the judge's, SKILL.md):
prints the compiler's errors, or the max error, or why it is wrong. Exit status 1 when not correct."""
import sys

from judge import ask, print_verification

if __name__ == "__main__":
    sys.exit(0 if print_verification(ask()) else 1)
