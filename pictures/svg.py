"""pictures.svg: a few shapes and monospace text, and the colours every picture shares.
A reader of the lesson need not read this module."""
import itertools
from xml.sax.saxutils import escape

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
ADVANCE = 0.61   # a DejaVu Sans Mono character is 0.602 em wide; a little to spare
INK, MUTED, FAINT = "#222222", "#666666", "#bbbbbb"
RED, GREEN = "#c62828", "#2e7d32"
RED_FILL = "#fbe0e0"
UPSTREAM_COLOURS = ("#eeeeee", "#555555")
CLIENT_COLOURS = {   # name -> (fill, stroke); the same client has the same colour in every picture
    "A": ("#dbe8f7", "#1f5fa8"),
    "B": ("#fde3cc", "#b85c00"),
    "C": ("#e4dcf3", "#5b3a9e"),
    "D": ("#d5eeec", "#00695c"),
    "E": ("#f6dcef", "#8e3a80"),
    "F": ("#f3efc8", "#7a6a00"),
    "G": ("#e2efd8", "#4f7f2a"),
    "H": ("#ece2dc", "#6d4c41"),
    "nobody": (RED_FILL, RED),   # bytes no request asked for
}


def colours(name):
    return CLIENT_COLOURS.get(name, UPSTREAM_COLOURS)


def number(value):
    """A coordinate as the file shows it: at most one decimal, so every run writes the same."""
    return f"{value:.1f}".removesuffix(".0")


def visible(data):
    """Bytes as a label: b"GET a\\n" -> GET a\\n (every line end shown)."""
    return repr(bytes(data))[2:-1]


def text_width(content, size):
    return len(content) * size * ADVANCE


class Svg:
    """An SVG picture that grows to hold what is drawn on it: every shape widens its extent, text by
    its estimated width; a shape left of or above the origin is a layout bug, and render()
    raises."""

    def __init__(self, title):
        self.title = title
        self.parts = []
        self.left = self.top = 0.0
        self.right = self.bottom = 0.0

    def _cover(self, x1, y1, x2, y2):
        self.left, self.top = min(self.left, x1, x2), min(self.top, y1, y2)
        self.right, self.bottom = max(self.right, x1, x2), max(self.bottom, y1, y2)

    def rect(self, x, y, width, height, fill="none", stroke="none", stroke_width=1, radius=0):
        self._cover(x, y, x + width, y + height)
        extra = f' rx="{radius}"' if radius else ""
        self.parts.append(f'<rect x="{number(x)}" y="{number(y)}" width="{number(width)}" '
                          f'height="{number(height)}" fill="{fill}" stroke="{stroke}" '
                          f'stroke-width="{number(stroke_width)}"{extra}/>')

    def line(self, x1, y1, x2, y2, stroke=INK, width=1.0, dash=None):
        self._cover(x1, y1, x2, y2)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{number(x1)}" y1="{number(y1)}" x2="{number(x2)}" '
                          f'y2="{number(y2)}" stroke="{stroke}" '
                          f'stroke-width="{number(width)}"{extra}/>')

    def polygon(self, points, fill):
        for x, y in points:
            self._cover(x, y, x, y)
        listed = " ".join(f"{number(x)},{number(y)}" for x, y in points)
        self.parts.append(f'<polygon points="{listed}" fill="{fill}"/>')

    def text(self, x, y, content, size=13, fill=INK, anchor="start", bold=False):
        """One line of monospace text; (x, y) is the baseline's start, middle or end."""
        width = text_width(content, size)
        start = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        self._cover(start, y - size, start + width, y + size * 0.3)
        weight = ' font-weight="bold"' if bold else ""
        anchor_attribute = f' text-anchor="{anchor}"' if anchor != "start" else ""
        self.parts.append(f'<text x="{number(x)}" y="{number(y)}" font-size="{size}" '
                          f'fill="{fill}"{anchor_attribute}{weight}>{escape(content)}</text>')

    def bytes_box(self, x, y, data, owner, size=13, wrong=False):
        """A box 24 high holding bytes as a label, filled with their owner's colour; returns its
        width."""
        fill, stroke = colours(owner)
        width = text_width(visible(data), size) + 10
        self.rect(x, y, width, 24, fill, RED if wrong else stroke, 2.5 if wrong else 1, radius=3)
        self.text(x + 5, y + 12 + size * 0.35, visible(data), size, INK)
        return width

    def legend(self, x, y, entries, owners="", owned="bytes", size=12):
        """A legend line, left to right: "<owner>'s bytes" in each owner's colours, then (label,
        fill, stroke) each."""
        for label, fill, stroke in ([(f"{owner}'s {owned}", *colours(owner)) for owner in owners]
                                    + entries):
            self.rect(x, y - size + 1, size, size, fill, stroke, 1.5)
            self.text(x + size + 6, y, label, size, INK)
            x += size + 6 + text_width(label, size) + 22

    def render(self, margin=16):
        if self.left < 0 or self.top < 0:
            raise ValueError(
                f"{self.title!r}: drawn outside the picture at ({self.left}, {self.top})")
        width, height = number(self.right + margin), number(self.bottom + margin)
        return "\n".join([
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="{FONT}" xml:space="preserve">',
            f"<title>{escape(self.title)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
            *self.parts,
            "</svg>",
            ""])


def titled(*lines):
    """A picture titled by its first line, shown bold with a line or two under it: (the Svg, the y
    below them)."""
    svg = Svg(lines[0])
    y = 28
    svg.text(16, y, lines[0], 16, INK, bold=True)
    for line in lines[1:]:
        y += 20
        svg.text(16, y, line, 12, MUTED)
    return svg, y + 22


def split(chunks, lengths):
    """The stream laid end to end from (tag, bytes) chunks, cut into consecutive pieces of the given
    lengths: a [(tag, bytes)] per piece, a chunk's bytes in each piece they overlap."""
    # where each chunk begins
    starts = [0, *itertools.accumulate(len(data) for _, data in chunks)]
    found, start = [], 0
    for length in lengths:
        end = start + length
        found.append([(tag, data[max(start - at, 0):end - at])
                      for (tag, data), at in zip(chunks, starts)
                      if at < end and at + len(data) > start])
        start = end
    return found


def sequence(svg, top, lanes, rows, remarks_x, row=34):
    """A sequence diagram from `top`: a named box and a dashed lifeline per lane ({name: x}), then
    one row per event down the page; returns the lifelines' bottom.

    A row is ("arrow", from lane, to lane, bytes, owner, wrong, remark): an arrow in its owner's
    colour under the bytes it carries, or ("note", lane, label, owner, wrong, remark): a box on the
    lane. Wrong rows are red; a remark is written at remarks_x."""
    bottom = top + row * (len(rows) + 1)
    for lane, x in lanes.items():
        width = max(110, text_width(lane, 13) + 14)
        svg.rect(x - width / 2, top - 26, width, 26, *colours(lane), 1.5, radius=4)
        svg.text(x, top - 8, lane, 13, INK, "middle", bold=True)
        svg.line(x, top, x, bottom, FAINT, 1.5, dash="4 4")
    for index, (kind, lane, *drawn) in enumerate(rows):
        y = top + row * (index + 1)
        if kind == "arrow":
            target, data, owner, wrong, remark = drawn
            x1, x2 = lanes[lane], lanes[target]
            tone = RED if wrong else colours(owner)[1]
            toward = 1 if x2 > x1 else -1   # right or left
            # then a head 8 long, 8 wide
            svg.line(x1, y, x2 - 8 * toward, y, tone, 2.5 if wrong else 1.5)
            svg.polygon([(x2, y), (x2 - 8 * toward, y + 4 * toward),
                         (x2 - 8 * toward, y - 4 * toward)], tone)
            label = visible(data)
            label_x = min(x1, x2) + 12
            svg.rect(label_x - 3, y - 20, text_width(label, 13) + 6, 17, "#ffffff")
            svg.text(label_x, y - 6, label, 13, RED if wrong else INK, bold=wrong)
        else:
            label, owner, wrong, remark = drawn
            width = text_width(label, 12) + 14
            fill, stroke = (RED_FILL, RED) if wrong else colours(owner)
            svg.rect(lanes[lane] - width / 2, y - 15, width, 22, fill, stroke, 2 if wrong else 1,
                     radius=3)
            svg.text(lanes[lane], y + 1, label, 12, RED if wrong else INK, "middle", bold=True)
        if remark:
            svg.text(remarks_x, y + 4, remark, 12, RED if wrong else MUTED, bold=wrong)
    return bottom


def borrows(svg, top, rule, note, rows, left=16):
    """A pool's borrows as steps, from `top`; returns the bottom.

    The rule and a note, then a row per borrower (client, exchanges, verdict, tone): each exchange
    a request it sent and the pieces (owner, bytes, wrong) it got, the n-th exchanges of every row
    in one column, then its verdict. Bytes are in the colour of the client whose request they
    answer, outlined red where they answer another request, or none."""
    svg.text(left, top, rule, 14, INK, bold=True)
    svg.text(left, top + 18, note, 12, MUTED)
    columns = range(max(len(row[1]) for row in rows))
    # each column's requests padded to its longest, so its boxes start in line
    widths = [max(len(visible(row[1][n][0])) for row in rows if n < len(row[1])) for n in columns]

    def label(n, client, request):
        return (f"{client} sent " if n == 0 else "") + f"{visible(request):<{widths[n]}} got"

    def extent(n, client, request, got):   # bytes_box(): its text and 10, then 2 to the next
        return (text_width(label(n, client, request), 13) + 8
                + sum(text_width(visible(data), 13) + 12 for _, data, _ in got))
    starts = [left]   # a column begins past the widest exchange of the one before it
    for n in columns[:-1]:
        starts.append(starts[n] + 14 + max(extent(n, row[0], *row[1][n])
                                           for row in rows if n < len(row[1])))
    y = top + 46
    for client, exchanges, verdict, tone in rows:
        for n, (request, got) in enumerate(exchanges):
            svg.text(starts[n], y, label(n, client, request), 13, INK)
            x = starts[n] + text_width(label(n, client, request), 13) + 8
            for owner, data, wrong in got:
                x += svg.bytes_box(x, y - 17, data, owner, 13, wrong=wrong) + 2
        svg.text(x + 10, y, verdict, 13, tone, bold=True)
        y += 32
    return y
