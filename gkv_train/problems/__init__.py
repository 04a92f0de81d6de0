"""Problem sets: presets, local files, hub datasets and the built-in generated tasks, with their splits."""
