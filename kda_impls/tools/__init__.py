"""The maintainer tools' logic: each module here is one tool, run by its command scripts/<name>.py
(scripts/README.md lists them by who runs them and when)."""
