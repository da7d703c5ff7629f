"""Developer scripts; a package so the test suite can import their pure parts."""
