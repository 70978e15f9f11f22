"""Times this folder's solution with the judge's clock beside eager PyTorch and torch.compile
(SKILL.md), once it builds and is correct; prints the reward it would get now."""
import sys

from judge import ask, print_profile

if __name__ == "__main__":
    sys.exit(0 if print_profile(ask()) else 1)
