"""``python -m satgate_mcp`` is the ``satgate-mcp`` console script."""

from satgate_mcp.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
