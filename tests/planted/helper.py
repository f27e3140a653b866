"""What ``planted/helped.py`` does to its output after the naive step: nothing (a test plants a bug
here in a copy)."""


def finish(out):
    return out
