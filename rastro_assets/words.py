"""How the product says a count in words, wherever it says one (the CLI, the UI's checks)."""


def counted(count: int, noun: str) -> str:
    """`1 account`, `2 accounts`: the count with its noun in the right number."""
    return f"{count} {noun if count == 1 else noun + 's'}"
