"""The operator commands' plain-text tables: aligned columns under a header."""


def aligned(columns, rows, numbers=()):
    """`rows` (tuples of text, one per column) in aligned columns under the
    `columns` header; the columns named in `numbers` right-aligned."""
    lines = [tuple(columns), *rows]
    widths = [max(len(line[column]) for line in lines) for column in range(len(columns))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if name in numbers else cell.ljust(width)
            for name, cell, width in zip(columns, line, widths, strict=True)
        ).rstrip()
        for line in lines
    )
