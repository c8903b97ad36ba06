"""python3 -m pictures [--check]: redraw every picture in pictures/ from the scenarios'
runs (Parts one and two, then Part three's, which need redis-server), or with
--check exit 1 if a checked-in picture differs from what the scenarios draw now."""
import sys

from pictures import draw, draw_part3

if __name__ == "__main__":
    first = draw.main()
    third = draw_part3.main()
    sys.exit(first or third)
