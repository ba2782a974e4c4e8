"""The ``plan`` command: the parser in ``main``, one module per subcommand. No planning logic lives
here: a command parses nothing itself, calls the API (or a phase's entry point) and prints what
planner.report returns."""
