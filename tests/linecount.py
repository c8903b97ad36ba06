"""Count a module's lines of code: not blank, not a comment, not part of a docstring.

    python3 linecount.py tcp_proxy.py
"""
import ast
import sys


def code_lines(path):
    with open(path, encoding="utf-8") as source:
        text = source.read()
    docstring_lines = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstring_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for number, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#")
               and number not in docstring_lines)


if __name__ == "__main__":
    for path in sys.argv[1:] or ["tcp_proxy.py"]:
        print(f"{path}: {code_lines(path)} lines of code")
