"""What a person hands the planner, read strictly: the built-in model zoo, clusters (presets, YAML,
mappings) and calibrations written by ``plan profile``. No torch here: models are built in
planner.trace.models."""
