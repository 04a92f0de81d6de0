"""The evidence pipeline: seeded, resumable comparisons of recipes, run by several processes at once."""
