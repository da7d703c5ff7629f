"""The daemon process: its sockets, its drain at a stop, its orphan guard, and the runner tying them together."""
