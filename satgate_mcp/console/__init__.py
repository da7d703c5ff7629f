"""The operator console (``/console``): its login, its pages and its JSON API (docs/console.md).

Wired by ``wiring.add_console``; nothing here is imported on a call's path.
"""
