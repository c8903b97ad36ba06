"""python3 -m pictures [--check]: redraw every picture in pictures/ from the scenarios' runs (Parts
one and two, then Part three's, which need redis-server), or with --check write nothing and exit 1
if a checked-in picture differs from what the scenarios draw now."""
import sys

from pictures import draw, draw_part3
from part3 import redis_server

if sys.argv[1:] not in ([], ["--check"]):
    sys.exit(__doc__)
svgs = draw.render_all()
if redis_server.redis_available():
    svgs.update(draw.render_all(pictures=draw_part3.PICTURES))
else:
    print(redis_server.INSTALL_HINT)
stale = draw.save(svgs, check=sys.argv[1:] == ["--check"])
sys.exit(1 if stale or not redis_server.redis_available() else 0)
